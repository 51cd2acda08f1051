"""
Helpers the test modules import (none of them is a test): child processes and
their handshakes (children), typed row factories (factories), process test
cases (processes, workers), commit counting (commits), the schedules' clock
helpers (schedules), a fast backlog (backlog_rows) and the server restarts
(servers).
"""

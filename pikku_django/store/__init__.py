"""
Operations across tables, each a guarded write on the database clock: a
step's attempts (``attempts``), a pass's take (``takes``) and its end
(``passes``), the run lease every run-level write is fenced to (``fence``),
a run's lifecycle (``lifecycle``: cancel, deadlines, a child's end), retry
and fork (``operate``, what a fork copies: ``forks``), and fan-out (``fanout``).
"""

from __future__ import annotations

"""A reader whose clock runs an hour fast still waits its timeout on the database clock."""

from __future__ import annotations

import json
import subprocess
from unittest import skipIf

from django.db import connection
from django.test import TransactionTestCase

from pikku_django.workflows import run_workflow, start_workflow
from tests.support.children import kill_all, read_line, start_script

ONE_HOUR_MS = 3_600_000

#: Runs under ``faketime -f +1h``: waits on a run that does not finish, and
#: reports its own clock and the DB's around each wait.
SKEWED_READER = """
import json, sys, time
import django
django.setup()
from pikku_django.errors import ResultTimeoutError
from pikku_django.models import Lease
from pikku_django.workflows import get_event, wait_for_result
from pikku_django.workflows import results

# libfaketime shifts the monotonic clock but not the kernel's timed waits on
# it, so a PostgreSQL ear's Event.wait would wait an hour: this reader polls
# (the deadline, the thing under test, is the same either way).
results.listening = lambda alias, run_id: None

run_id = sys.argv[1]
db = Lease.objects.db_now_ms
report = {"time_ms": int(time.time() * 1000), "db_now_ms": db()}
before = db()
try:
    wait_for_result(run_id, timeout_ms=1500)
    report["result"] = "returned"
except ResultTimeoutError:
    report["result"] = "timed out"
report["result_waited_ms"] = db() - before
before = db()
report["event"] = get_event(run_id, "never", timeout_ms=1000)
report["event_waited_ms"] = db() - before
print(json.dumps(report), flush=True)
"""


@skipIf(
    connection.vendor == "sqlite",
    "on SQLite the clock is the process clock by design (one host), so a skewed process skews it too",
)
class SkewedReaderTests(TransactionTestCase):
    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def tearDown(self) -> None:
        kill_all(self.procs)

    def test_a_reader_an_hour_fast_waits_its_timeout_on_the_db_clock(self) -> None:
        run = run_workflow(start_workflow("test.emits", {}).pk)
        assert run.status == "suspended"
        proc = start_script(SKEWED_READER, str(run.pk), prefix=["faketime", "-f", "+1h"])
        self.procs.append(proc)
        report = json.loads(read_line(proc, timeout=60))
        skew = report["time_ms"] - report["db_now_ms"]
        assert abs(skew - ONE_HOUR_MS) < 60_000, skew
        assert report["result"] == "timed out"
        assert 1500 <= report["result_waited_ms"] < 1500 + 1000, report
        assert report["event"] is None
        assert 1000 <= report["event_waited_ms"] < 1000 + 1000, report

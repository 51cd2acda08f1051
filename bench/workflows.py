"""
Steps per second through ``manage.py pikku_worker`` processes, and where a pass spends its time.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench .venv/bin/python bench/workflows.py
    DATABASE_URL=mysql://root@127.0.0.1:3306/bench .venv/bin/python bench/workflows.py

Part 1, worker processes. ``--runs`` runs of the test project's ``test.steps``
workflow with input ``{"steps": 10}`` (testproject/testing/workflows.py: ten
trivial steps; each step body writes one ``StepCall`` row, and each pass one
``PassRecord`` row, so a step is not free: that is stated, not hidden). The
runs are created not yet due; 1 or 2 ``manage.py pikku_worker --interval 0.05
--batch 20 -v 0`` processes are started and, once each has connected to the
database, every run is made due in one UPDATE and the clock starts; it stops
when a poll (every 20 ms) finds every run completed. Workers are then stopped
with SIGTERM. Repeated ``--rounds`` times, 1 and 2 workers alternating.

Part 2, one pass profiled. ``--profile-runs`` more runs driven in this
process by the worker loop itself (``pikku_django.worker.process.Worker(once=True)``:
its due query and guarded take, then ``run_workflow`` on each run), with
``connection.execute_wrapper`` timing every statement. Each statement is
classed by the pikku operation it runs inside (the manager methods and the
test workflow's bookkeeping helpers are wrapped here, in this process only);
COMMIT, ``SET autocommit`` and connecting, which never pass through
``execute_wrapper``, are timed by wrapping the connection's own methods. The
table gives each class's share of the wall time.

The database should be a scratch one (``bench``): this refuses to start while
other runs are running, since the workers would drive them too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _setup import ROOT, migrate_if_needed, revision  # noqa: F401  (first: sets Django up)
from django.db import DEFAULT_DB_ALIAS, connection, connections

from bench import workflow_headline as headline
from bench.steps import environment, positive_int
from pikku_django import sql
from pikku_django.conf import conf
from pikku_django.managers import LeaseManager, WorkflowStepManager
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing import workflows as test_workflows
from testproject.testing.models import PassRecord, StepCall

WORKFLOW = "test.steps"
STEPS = 10
WORKER_ARGS = ["pikku_worker", "--interval", "0.05", "--batch", "20", "-v", "0"]


# ---------------------------------------------------------------------------
# Bench rows
# ---------------------------------------------------------------------------


def create_runs(count: int, due: bool) -> list[Any]:
    ids = [start_workflow(WORKFLOW, {"steps": STEPS}).pk for _ in range(count)]
    if not due:
        WorkflowRun.objects.filter(pk__in=ids).update(wake_at=None)
    return ids


def drop_runs(ids: list[Any]) -> None:
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        StepCall.objects.filter(run_id__in=chunk).delete()
        PassRecord.objects.filter(run_id__in=chunk).delete()
        Lease.objects.filter(key__in=[f"workflow-run:{pk}" for pk in chunk]).delete()
        WorkflowStepAttempt.objects.filter(step__run_id__in=chunk).delete()
        WorkflowStep.objects.filter(run_id__in=chunk).delete()
        WorkflowRun.objects.filter(pk__in=chunk).delete()


def check_runs(ids: list[Any]) -> str:
    """What the runs show: every run completed, every step body called once, passes per run."""
    completed = WorkflowRun.objects.filter(pk__in=ids, status="completed").count()
    calls = StepCall.objects.filter(run_id__in=ids).count()
    passes = PassRecord.objects.filter(run_id__in=ids).count()
    steps = WorkflowStep.objects.filter(run_id__in=ids, status="succeeded", attempt=1).count()
    return (
        f"{completed}/{len(ids)} runs completed; {steps}/{len(ids) * STEPS} steps succeeded on attempt 1; "
        f"{calls} step-body calls; {passes / len(ids):.2f} passes per run"
    )


# ---------------------------------------------------------------------------
# Part 1: worker processes
# ---------------------------------------------------------------------------


def connected(pid: int) -> bool:
    """Has the process opened a socket (its database connection), or the SQLite file? Linux only."""
    fds = Path(f"/proc/{pid}/fd")
    target = str(connection.settings_dict["NAME"]) if connection.vendor == "sqlite" else "socket:"
    try:
        return any(os.readlink(fd).startswith(target) for fd in fds.iterdir())
    except (FileNotFoundError, PermissionError):
        return False


@dataclass
class Trial:
    workers: int
    runs: int
    seconds: float = 0.0
    check: str = ""
    exits: list[int | None] = field(default_factory=list)

    @property
    def steps_per_second(self) -> float:
        return self.runs * STEPS / self.seconds


def trial(
    workers: int,
    runs: int,
    timeout: float,
    logs: Path,
    create: Callable[[int], list[Any]] | None = None,
    check: Callable[[list[Any]], str] = check_runs,
) -> Trial:
    ids = create(runs) if create is not None else create_runs(runs, due=False)
    result = Trial(workers, runs)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(workers):
            log = open(logs / f"worker-{workers}-{n}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), *WORKER_ARGS],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 60
        while not all(connected(p.pid) for p in procs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"workers did not start; see {logs}")
            time.sleep(0.02)
        # Each has connected (system checks, then its first due query); one more poll interval.
        time.sleep(0.2)
        started = time.perf_counter()
        WorkflowRun.objects.filter(pk__in=ids).update(wake_at=0)
        left = runs
        while left:
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{left} runs not completed after {timeout:g} s; see {logs}")
            time.sleep(0.02)
            left = WorkflowRun.objects.filter(pk__in=ids).exclude(status="completed").count()
        result.seconds = time.perf_counter() - started
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            result.exits.append(p.returncode)
    result.check = check(ids)
    drop_runs(ids)
    return result


# ---------------------------------------------------------------------------
# Part 2: one in-process driver, every statement timed and classed
# ---------------------------------------------------------------------------

LEASE_ACQUIRE = "run lease: acquire"
LEASE_REFRESH = "run lease: refresh"
LEASE_RELEASE = "run lease: release"
CLAIM = "step claim"
STEP_REFRESH = "step lease: refresh"
INSERT = "start_step (insert claimed)"
RECORD = "finish_attempt (outcome)"
WORKER = "worker loop: due query + take"
BODY = "step body (StepCall row)"
BOOKKEEPING = "pass bookkeeping (PassRecord row)"
CONNECT = "connect"
OTHER = "other (run/step reads, run update, clock)"
LEASE_AND_CLAIM = (LEASE_ACQUIRE, LEASE_REFRESH, LEASE_RELEASE, CLAIM, STEP_REFRESH)
ORDER = [
    LEASE_ACQUIRE,
    LEASE_REFRESH,
    LEASE_RELEASE,
    CLAIM,
    STEP_REFRESH,
    INSERT,
    RECORD,
    WORKER,
    BODY,
    BOOKKEEPING,
    CONNECT,
    OTHER,
]


class Profile:
    """Statement and transaction-control time by the operation it runs inside."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.db: dict[str, float] = {}
        self.statements: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.op: dict[str, float] = {}

    @property
    def label(self) -> str:
        return self.stack[0] if self.stack else OTHER

    def add(self, label: str, seconds: float, statement: bool) -> None:
        self.db[label] = self.db.get(label, 0.0) + seconds
        if statement:
            self.statements[label] = self.statements.get(label, 0) + 1

    def __call__(
        self, execute: Callable[..., Any], sql_text: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql_text, params, many, context)
        finally:
            self.add(self.label, time.perf_counter() - started, True)

    @contextlib.contextmanager
    def inside(self, label: str) -> Iterator[None]:
        outer = not self.stack
        self.stack.append(label)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.stack.pop()
            if outer:
                self.op[label] = self.op.get(label, 0.0) + time.perf_counter() - started
                self.calls[label] = self.calls.get(label, 0) + 1

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.inside(label):
                return fn(*args, **kwargs)

        return wrapped

    def timed(self, fn: Callable[..., Any], label: str | None = None) -> Callable[..., Any]:
        """A connection method whose time counts to the current operation (or ``label``)."""

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label or self.label, time.perf_counter() - started, False)

        return wrapped


@contextlib.contextmanager
def patched(profile: Profile) -> Iterator[None]:
    """Wrap the operations in this process only; put everything back after."""
    saved: list[tuple[Any, str, Any]] = []

    def put(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name))))
        setattr(owner, name, value)

    for owner, name, label in [
        (LeaseManager, "acquire", LEASE_ACQUIRE),
        (LeaseManager, "refresh", LEASE_REFRESH),
        (LeaseManager, "release", LEASE_RELEASE),
        (WorkflowStepManager, "claim", CLAIM),
        (WorkflowStepManager, "claim_attempt", CLAIM),
        (WorkflowStepManager, "start_step", INSERT),
        (WorkflowStepManager, "finish_attempt", RECORD),
        (WorkflowStepManager, "refresh_lease", STEP_REFRESH),
        (WorkflowStepManager, "insert_step", INSERT),
        (WorkflowStepManager, "record_result", RECORD),
        (WorkflowStepManager, "record_error", RECORD),
        (Worker, "run_batch", WORKER),
        (test_workflows, "record_call", BODY),
    ]:
        put(owner, name, profile.wrap(label, getattr(owner, name)))
    # The drive itself is not the worker loop's own time.
    put(Worker, "drive", _unlabelled(profile, Worker.drive))

    original_pass = test_workflows.recorded_pass

    @contextlib.contextmanager
    def recorded_pass(run_id: Any) -> Iterator[None]:
        manager = original_pass(run_id)
        with profile.inside(BOOKKEEPING):
            manager.__enter__()
        try:
            yield
        except BaseException:
            with profile.inside(BOOKKEEPING):
                if not manager.__exit__(*sys.exc_info()):
                    raise
        else:
            with profile.inside(BOOKKEEPING):
                manager.__exit__(None, None, None)

    put(test_workflows, "recorded_pass", recorded_pass)
    # Connection-level costs: commit, autocommit switches (a round trip on MySQL), connecting.
    # Patched on this thread's DatabaseWrapper itself (``django.db.connection`` is a proxy).
    wrapper = connections[DEFAULT_DB_ALIAS]
    for name in ("_commit", "_rollback", "_set_autocommit"):
        wrapper.__dict__[name] = profile.timed(getattr(wrapper, name))
    wrapper.__dict__["connect"] = profile.timed(wrapper.connect, CONNECT)
    try:
        with wrapper.execute_wrapper(profile):
            yield
    finally:
        for name in ("_commit", "_rollback", "_set_autocommit", "connect"):
            wrapper.__dict__.pop(name, None)
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _unlabelled(profile: Profile, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` with the label stack cleared (a drive inside the worker loop's batch)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        stack, profile.stack = profile.stack, []
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            profile.stack = stack
            if stack:
                # Not the enclosing operation's own time.
                profile.op[stack[0]] = profile.op.get(stack[0], 0.0) - (time.perf_counter() - started)

    return wrapped


def profile_pass(runs: int) -> tuple[Profile, float, str]:
    ids = create_runs(runs, due=True)
    profile = Profile()
    worker = Worker(once=True, batch=20, interval=0.05)
    with patched(profile):
        started = time.perf_counter()
        worker.run()
        wall = time.perf_counter() - started
    check = check_runs(ids)
    drop_runs(ids)
    return profile, wall, check


def profile_table(profile: Profile, wall: float, runs: int) -> list[str]:
    steps = runs * STEPS
    head = f"{'class':<42} {'stmts/step':>10} {'DB ms/step':>10} {'DB share':>8} {'op share':>8}"
    lines = [head, "-" * len(head)]
    for label in ORDER:
        if label not in profile.db and label not in profile.op:
            lines.append(f"{label:<42} {0:>10.2f} {0:>10.3f} {0:>7.1%} {'-':>8}")
            continue
        db = profile.db.get(label, 0.0)
        op = profile.op.get(label)
        lines.append(
            f"{label:<42} {profile.statements.get(label, 0) / steps:>10.2f} {db * 1000 / steps:>10.3f} "
            f"{db / wall:>7.1%} {'-' if op is None else f'{op / wall:.1%}':>8}"
        )
    db_total = sum(profile.db.values())
    lines.append("-" * len(head))
    lines.append(
        f"{'all database time':<42} {sum(profile.statements.values()) / steps:>10.2f} "
        f"{db_total * 1000 / steps:>10.3f} {db_total / wall:>7.1%}"
    )
    lines.append(
        f"{'Python and the rest (wall - DB)':<42} {'':>10} {(wall - db_total) * 1000 / steps:>10.3f} "
        f"{(wall - db_total) / wall:>7.1%}"
    )
    lease_claim_db = sum(profile.db.get(k, 0.0) for k in LEASE_AND_CLAIM)
    lease_claim_op = sum(profile.op.get(k, 0.0) for k in LEASE_AND_CLAIM)
    lines.append("")
    lines.append(
        f"lease and claim statements (run lease acquire/refresh/release, step claim, step lease refresh): "
        f"{lease_claim_db / wall:.1%} of wall time as DB time, {lease_claim_op / wall:.1%} as whole "
        f"operations (with their Python); {lease_claim_db / db_total:.1%} of all DB time"
    )
    lines.append(
        f"wall: {wall:.2f} s for {runs} runs x {STEPS} steps = {steps / wall:.0f} steps/s in one process; "
        f"run lease acquires {profile.calls.get(LEASE_ACQUIRE, 0)}, claims {profile.calls.get(CLAIM, 0)}, "
        f"refreshes {profile.calls.get(LEASE_REFRESH, 0) + profile.calls.get(STEP_REFRESH, 0)} "
        f"(renewals run on their own threads and connections every ttl/3, a step's on the keeper: "
        f"{conf.LEASE_TTL_MS / 3000:g} s for the run lease, {conf.STEP_LEASE_MS / 3000:g} s for a step; "
        f"none falls inside a pass this short, and they are not on this connection)"
    )
    return lines


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=positive_int, default=200, help="runs per trial (default %(default)r)")
    parser.add_argument(
        "--rounds", type=positive_int, default=2, help="trials per worker count (default %(default)r)"
    )
    parser.add_argument(
        "--profile-runs", type=positive_int, default=40, help="runs driven in-process (default %(default)r)"
    )
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="seconds per trial (default %(default)r)"
    )
    parser.add_argument(
        "--headline-only", action="store_true", help="only the headline table (issue #9), not parts 1 and 2"
    )
    parser.add_argument(
        "--lanes",
        type=positive_int,
        default=None,
        help="the workers' --concurrency (default: the worker's own default)",
    )
    args = parser.parse_args(argv)
    if args.lanes is not None:
        WORKER_ARGS.extend(["--concurrency", str(args.lanes)])

    migrated = migrate_if_needed()
    busy = WorkflowRun.objects.filter(status="running").count()
    if busy:
        raise SystemExit(
            f"{busy} runs are running in this database; the workers would drive them too. "
            "Point DATABASE_URL at a scratch database (e.g. .../bench)."
        )
    logs = Path(os.environ.get("PIKKU_BENCH_LOGS", Path(tempfile.gettempdir()) / "pikku-bench-workflows"))
    logs.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    header = environment(["(migrated the database first)"] if migrated else [])
    header.append(
        f"settings: PIKKU_LEASE_TTL_MS={conf.LEASE_TTL_MS} PIKKU_STEP_LEASE_MS={conf.STEP_LEASE_MS} "
        f"CONN_MAX_AGE={connection.settings_dict.get('CONN_MAX_AGE')}; "
        f"workers: manage.py {' '.join(WORKER_ARGS)}"
    )

    order = [1, 2, 2, 1] * ((args.rounds + 1) // 2)
    order = order[: 2 * args.rounds]
    headline.RUNS_PER_TRIAL[0] = args.runs
    counts = headline.count_per_step()
    floors: list[float] = []
    runs_done: list[tuple[int, float, float, str]] = []
    for workers in order:
        before = headline.floor_pair_us()
        done = trial(workers, args.runs, args.timeout, logs, headline.create_runs, headline.check_runs)
        after = headline.floor_pair_us()
        floors += [before, after]
        runs_done.append((workers, done.seconds, (before + after) / 2, done.check))
    print("\n".join(header))
    print()
    print(
        f"Headline: {args.runs} runs x {headline.STEPS} no-I/O steps ({headline.WORKFLOW}) per trial, "
        "through worker processes, on Django's default database settings"
    )
    print("\n".join(headline.table(runs_done, floors, counts, sql.variant(connection))))
    if args.headline_only:
        print(f"(load average {os.getloadavg()[0]:.2f} at the end; {time.monotonic() - began:.0f} s in all)")
        return
    print()

    trials: list[Trial] = []
    for workers in order:
        trials.append(trial(workers, args.runs, args.timeout, logs))
    profile, wall, check = profile_pass(args.profile_runs)
    print(f"Part 1: {args.runs} runs x {STEPS} steps per trial, through worker processes")
    head = f"{'workers':>7} {'steps/s':>8} {'seconds':>8}  exit codes  check"
    print(head)
    print("-" * len(head))
    for t in trials:
        print(f"{t.workers:>7} {t.steps_per_second:>8.0f} {t.seconds:>8.2f}  {str(t.exits):<10}  {t.check}")
    medians = {}
    for workers in (1, 2):
        rates = [t.steps_per_second for t in trials if t.workers == workers]
        medians[workers] = statistics.median(rates)
        print(f"median, {workers} worker{'s' if workers > 1 else ''}: {medians[workers]:.0f} steps/s")
    print(
        f"2 workers / 1 worker: {medians[2] / medians[1]:.2f}x "
        f"({os.cpu_count()} cores, database on the same host)"
    )
    print()
    print(f"Part 2: {args.profile_runs} runs x {STEPS} steps driven in this process by Worker(once=True)")
    print("\n".join(profile_table(profile, wall, args.profile_runs)))
    print(f"check: {check}")
    print(f"(load average {os.getloadavg()[0]:.2f} at the end; {time.monotonic() - began:.0f} s in all)")
    which = sql.variant(connection)
    if which == "sqlite":
        print("(SQLite: the issue measures PostgreSQL and MariaDB)")


if __name__ == "__main__":
    main()

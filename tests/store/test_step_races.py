"""
Steps raced by real OS processes on the live test database: two claimants,
many rounds; exactly one wins each claim, and a fenced-out attempt's write is
always refused.
"""

from __future__ import annotations

import json
import subprocess

from django.test import TransactionTestCase

from pikku_django.models import WorkflowStep, WorkflowStepAttempt
from tests.support.children import finish, kill_all, read_line, send_line, start_script
from tests.support.factories import lapse_step, make_step

ROUNDS = 25

#: A claimant: answers each command line on stdin with one JSON line, until EOF.
#:   claim <run_id> <step_name>          -> {"won": bool, "attempt": n | null}
#:   result <step_id> <attempt>          -> {"ok": bool, "error": name | null}
CLAIMANT = """
import json, sys
import django
django.setup()
from pikku_django.errors import StepSupersededError
from pikku_django.models import WorkflowStep

WorkflowStep.objects.exists()  # connect before the first command
print("ready", flush=True)
for line in sys.stdin:
    command, *args = line.split()
    if command == "claim":
        step = WorkflowStep.objects.claim(args[0], args[1], "shop.charge", 60000)
        print(json.dumps({"won": step is not None, "attempt": step and step.attempt}), flush=True)
    elif command == "result":
        try:
            WorkflowStep.objects.record_result(args[0], {"by": int(args[1])}, attempt=int(args[1]))
            print(json.dumps({"ok": True, "error": None}), flush=True)
        except StepSupersededError as e:
            print(json.dumps({"ok": False, "error": type(e).__name__}), flush=True)
"""


class StepRaceTests(TransactionTestCase):
    def setUp(self) -> None:
        self.procs: list[subprocess.Popen[str]] = [start_script(CLAIMANT) for _ in range(2)]
        for proc in self.procs:
            assert read_line(proc, timeout=60).strip() == "ready"

    def tearDown(self) -> None:
        kill_all(self.procs)

    def both(self, first: str, second: str | None = None) -> list[dict]:
        """Send one command to each claimant at once; return both answers."""
        send_line(self.procs[0], first)
        send_line(self.procs[1], second or first)
        return [json.loads(read_line(proc, timeout=60)) for proc in self.procs]

    def race_claims(self, prepare) -> list[WorkflowStep]:  # type: ignore[no-untyped-def]
        steps = []
        for i in range(ROUNDS):
            step = make_step(step_name=f"charge-{i}", retries=3)
            prepare(step)
            answers = self.both(f"claim {step.run_id} {step.step_name}")
            assert sorted(a["won"] for a in answers) == [False, True], (i, answers)
            step.refresh_from_db()
            assert step.status == "running"
            assert [a["attempt"] for a in answers if a["won"]] == [step.attempt]
            steps.append(step)
        return steps

    def test_pending_step_one_winner(self) -> None:
        for step in self.race_claims(lambda step: None):
            assert step.attempt == 1
            assert list(step.attempts.values_list("attempt", "status")) == [(1, "running")]

    def test_scheduled_step_one_winner(self) -> None:
        def schedule(step: WorkflowStep) -> None:
            WorkflowStep.objects.filter(pk=step.pk).update(status="scheduled", attempt=2)
            WorkflowStepAttempt.objects.filter(step=step).update(attempt=2, status="scheduled")

        for step in self.race_claims(schedule):
            assert step.attempt == 2
            assert list(step.attempts.values_list("attempt", "status")) == [(2, "running")]

    def test_failed_step_one_winner_attempt_two_not_three(self) -> None:
        def fail(step: WorkflowStep) -> None:
            WorkflowStep.objects.claim(step.run_id, step.step_name, "shop.charge", 60000)
            WorkflowStep.objects.record_error(step.pk, RuntimeError("declined"), attempt=1)

        for step in self.race_claims(fail):
            assert step.attempt == 2
            assert list(step.attempts.values_list("attempt", "status")) == [(1, "failed"), (2, "running")]

    def test_lapsed_step_one_winner(self) -> None:
        def lose_worker(step: WorkflowStep) -> None:
            WorkflowStep.objects.claim(step.run_id, step.step_name, "shop.charge", 60000)
            lapse_step(step)

        for step in self.race_claims(lose_worker):
            assert step.attempt == 2

    def test_attempt_one_always_refused_racing_attempt_two(self) -> None:
        for i in range(ROUNDS):
            step = make_step(step_name=f"charge-{i}", retries=3)
            WorkflowStep.objects.claim(step.run_id, step.step_name, "shop.charge", 60000)
            lapse_step(step)
            WorkflowStep.objects.claim(step.run_id, step.step_name, "shop.charge", 60000)
            # Alternate who is sent first, so neither side always leads.
            first, second = (1, 2) if i % 2 else (2, 1)
            answers = self.both(f"result {step.pk} {first}", f"result {step.pk} {second}")
            by_attempt = {first: answers[0], second: answers[1]}
            assert by_attempt[1] == {"ok": False, "error": "StepSupersededError"}, (i, answers)
            assert by_attempt[2] == {"ok": True, "error": None}, (i, answers)
            step.refresh_from_db()
            assert (step.status, step.result) == ("succeeded", {"by": 2})
            assert list(step.attempts.values_list("attempt", "status")) == [(1, "running"), (2, "succeeded")]

    def test_children_exit_cleanly(self) -> None:
        for proc in self.procs:
            assert finish(proc, timeout=60) == ""  # EOF on stdin ends the loop

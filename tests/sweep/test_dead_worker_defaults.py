"""
A dead worker is noticed in seconds on default settings: a worker SIGKILLed
mid-step has that step claimed again by another worker within 15 s (the
default step lease, renewed every third while the step runs, plus the
default sweep interval), and the worker that takes it over says so at its
default verbosity.
"""

from __future__ import annotations

import time

import pytest

from pikku_django.conf import DEFAULTS
from pikku_django.models import WorkflowStep
from pikku_django.workflows import start_workflow
from tests.support.children import poll_until, subprocess_env
from tests.support.processes import ProcessTestCase, epoch_ms, running_at

pytestmark = pytest.mark.slow

#: What DESIGN promises on default settings.
RECLAIMED_WITHIN_S = 15.0


class DeadWorkerOnDefaultsTests(ProcessTestCase):
    def test_a_step_killed_on_defaults_is_claimed_again_within_15_s(self) -> None:
        # Default leases: the child processes get no PIKKU_* lease setting.
        env = {
            key: value
            for key, value in subprocess_env().items()
            if key not in ("PIKKU_LEASE_TTL_MS", "PIKKU_STEP_LEASE_MS")
        }
        assert DEFAULTS["PIKKU_STEP_LEASE_MS"] <= 10_000
        run = start_workflow("test.blocker", {"lease_ms": None})
        # The default sweep interval (5 s), as `pikku_worker` runs with no option.
        first = self.worker("worker-a", "--sweep-interval", "5", "--interval", "0.1", env=env)
        victim, kill_ms = self.killed_mid_step(run, first)
        killed = time.monotonic()
        survivor = self.worker("worker-b", "--sweep-interval", "5", "--interval", "0.1", env=env)
        step = WorkflowStep.objects.get(run=run, step_name="block")
        reclaimed = poll_until(lambda: running_at(step, 2), timeout=RECLAIMED_WITHIN_S + 5, interval=0.05)
        seen_s = time.monotonic() - killed
        reclaim_s = (epoch_ms(reclaimed) - kill_ms) / 1000
        assert reclaim_s <= RECLAIMED_WITHIN_S, f"claimed again {reclaim_s:.1f} s after the kill"
        assert seen_s <= RECLAIMED_WITHIN_S + 2, seen_s
        # The survivor's sweep said whose step it was, at its default verbosity.
        poll_until(lambda: "lost its worker worker-a" in self.log(survivor), timeout=5)
        assert victim.returncode is not None

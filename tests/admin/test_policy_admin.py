"""The admin on policies: each attempt's error and the delay before the next; timeouts on the timeline."""

from __future__ import annotations

import datetime

from django.contrib.auth.models import User
from django.test import TestCase, TransactionTestCase
from django.urls import reverse

from pikku_django.admin.timeline import bars
from pikku_django.models import WorkflowStep
from pikku_django.workflows import run_workflow, start_workflow
from tests.workflows import test_policies

T0 = datetime.datetime(2026, 12, 1, 9, 0, tzinfo=datetime.timezone.utc)


def at(ms: int) -> datetime.datetime:
    return T0 + datetime.timedelta(milliseconds=ms)


class PolicyAdminTests(TransactionTestCase):
    def setUp(self) -> None:
        test_policies.calls.clear()
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))

    def test_the_step_page_shows_each_attempts_error_and_the_delay_before_the_next(self) -> None:
        run = start_workflow(
            "policies.step", {"key": "adm", "failures": 1, "max_attempts": 2, "backoff": "long"}
        )
        run_workflow(run.pk)
        step = WorkflowStep.objects.get(run=run)
        page = self.client.get(reverse("admin:pikku_django_workflowstep_change", args=[step.pk]))
        assert page.status_code == 200
        text = page.content.decode()
        assert "delay before the next" in text.lower() and "adm failure 1" in text
        assert "due 1 min 0 s after it" in text


class TimelineTimeoutTests(TestCase):
    def test_a_timed_out_attempt_is_drawn_as_such(self) -> None:
        row = {
            "step_id": "s",
            "attempt": 1,
            "status": "failed",
            "holder": "w-1",
            "created_at": at(0),
            "running_at": at(0),
            "succeeded_at": None,
            "failed_at": at(1_000),
            "step__step_name": "slow",
            "step__rpc_name": "shop.slow",
            "step__retry_delay": None,
            "error": {"type": "pikku_django.errors.StepTimeoutError", "message": "past"},
        }
        assert [s.kind for s in bars([row], at(2_000))[0].segments] == ["timeout"]
        row["error"] = {"type": "builtins.ValueError"}
        assert [s.kind for s in bars([row], at(2_000))[0].segments] == ["failed"]

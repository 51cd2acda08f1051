"""``USE_TZ = False``: delays and sleeps are judged in epoch ms on the database clock."""

from __future__ import annotations

import datetime
from typing import Any

from django.db.models import F
from django.test import TransactionTestCase, override_settings

from pikku_django.models import Lease, WorkflowRun
from pikku_django.sweep import sweep
from pikku_django.workflows import run_workflow, send_signal, start_workflow, workflow

FAILURES: dict[str, int] = {}


def fails_once(key: str) -> str:
    FAILURES[key] = FAILURES.get(key, 0) + 1
    if FAILURES[key] == 1:
        raise RuntimeError("first try fails")
    return "ok"


@workflow("naive.retry_later")
def retry_later(ctx: Any, input: Any) -> Any:
    first = ctx.step("flaky", fails_once, input["key"], retries=1, retry_delay=input["delay"])
    ctx.sleep("nap", input["nap"])
    return {"first": first, "signal": ctx.wait_for_signal("go")}


# A zone far from UTC: a naive datetime read as local time would be hours off.
@override_settings(USE_TZ=False, TIME_ZONE="America/New_York")
class NaiveDatetimeTests(TransactionTestCase):
    def test_a_retry_delay_and_a_sleep_are_judged_on_the_database_clock(self) -> None:
        run = start_workflow("naive.retry_later", {"key": "a", "delay": 60_000, "nap": 60_000})
        before = Lease.objects.db_now_ms()
        run = run_workflow(run.pk)
        # The step failed once and waits a minute: not less, not hours.
        assert run.status == "running" and FAILURES["a"] == 1
        assert before + 59_000 <= run.wake_at <= Lease.objects.db_now_ms() + 60_000
        assert run_workflow(run.pk).wake_at == run.wake_at
        assert FAILURES["a"] == 1
        # Once the delay is over (moved into the past), the step runs again.
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=0)
        run.steps.filter(step_name="flaky").update(retry_delay=1)
        run = run_workflow(run.pk)
        assert FAILURES["a"] == 2
        nap = run.steps.get(step_name="nap")
        assert run.wake_at == nap.data["wake_at"]
        assert 59_000 <= nap.data["wake_at"] - Lease.objects.db_now_ms() <= 60_000
        # The sweep leaves the sleeping run alone, and a signal is stored and waits.
        assert sweep().woken_runs == 0
        send_signal(run.pk, "go", 1)
        assert WorkflowRun.objects.get(pk=run.pk).wake_at == nap.data["wake_at"]


@override_settings(USE_TZ=False, TIME_ZONE="America/New_York")
class NaiveAdminTests(TransactionTestCase):
    def test_a_runs_age_in_the_admin_is_judged_on_the_database_clock(self) -> None:
        from django.contrib.admin.sites import site
        from django.test import RequestFactory

        run = start_workflow("naive.retry_later", {"key": "b", "delay": 1, "nap": 1})
        # Two minutes old, moved in SQL (no zone involved).
        WorkflowRun.objects.filter(pk=run.pk).update(
            created_at=F("created_at") - datetime.timedelta(minutes=2)
        )
        admin = site._registry[WorkflowRun]
        shown = admin.get_queryset(RequestFactory().get("/")).get(pk=run.pk)
        # Two minutes, not two minutes off by the five hours between New York and UTC.
        assert admin.age(shown).startswith("2 min"), admin.age(shown)

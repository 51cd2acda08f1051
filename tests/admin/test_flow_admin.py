"""The run page says why flow control holds a run: debounced, rate-limited, its key's slots."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import TestCase, override_settings
from django.urls import reverse

from pikku_django.admin.flow import describe_flow
from pikku_django.models import Lease, WorkflowRun
from pikku_django.queues import key_slot_keys
from pikku_django.workflows import start_workflow

QUEUES = {"sync": {"per_key": {"concurrency": 2}, "rate": {"limit": 1, "period_ms": 60_000}}}


def now_ms() -> int:
    return Lease.objects.db_now_ms()


@override_settings(PIKKU_QUEUES=QUEUES)
class FlowAdminTests(TestCase):
    def test_a_debounced_run_says_until_when(self) -> None:
        run = start_workflow("test.echo_input", 1, key="doc", debounce_ms=90_000)
        assert describe_flow(run, now_ms()).startswith("debounced until ")
        assert "(in 1 min" in describe_flow(run, now_ms())

    def test_a_rate_limited_run_and_its_key_slots(self) -> None:
        run = start_workflow("test.steps", {"steps": 1}, queue="sync", key="t1")
        assert describe_flow(run, now_ms()) == "key slots 0/2"
        for i, slot in enumerate(key_slot_keys("sync", "t1", 2)):
            Lease.objects.acquire(slot, f"w{i}", 60_000)
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=now_ms() + 30_000)
        run.refresh_from_db()
        text = describe_flow(run, now_ms())
        assert text.startswith("rate-limited until ") and text.endswith("; key slots 2/2")

    def test_the_run_page_shows_it(self) -> None:
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(user)
        run = start_workflow("test.steps", {"steps": 1}, queue="sync", key="tenant:7", dedup_key="d-7")
        body = self.client.get(
            reverse("admin:pikku_django_workflowrun_change", args=[run.pk])
        ).content.decode()
        assert "key slots 0/2" in body and "tenant:7" in body and "d-7" in body

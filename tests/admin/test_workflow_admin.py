"""The workflow admin: runs, steps and attempts render, stay read-only, cost a bounded
number of queries, and the wake and cancel actions work, for a superuser."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.sites import site
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.admin import (
    WorkflowRunAdmin,
    WorkflowStepAdmin,
    WorkflowStepAttemptInline,
    WorkflowStepInline,
    format_ms,
)
from pikku_django.models import Lease, WorkflowRun, WorkflowStep, WorkflowStepAttempt

LEASE_MS = 60_000


def now_ms() -> int:
    return Lease.objects.db_now_ms()


def claim(step: WorkflowStep) -> WorkflowStep:
    claimed = WorkflowStep.objects.claim(step.run_id, step.step_name, step.rpc_name, LEASE_MS)
    assert claimed is not None
    return claimed


def lapse(step: WorkflowStep, ago_ms: int = 5_000) -> None:
    """Move the step's lease into the past on the DB clock (no sleeping)."""
    WorkflowStep.objects.filter(pk=step.pk).update(lease_expires_at=now_ms() - ago_ms)


def build_run(workflow: str = "order") -> tuple[WorkflowRun, dict[str, WorkflowStep]]:
    """A running run with a step in each state the admin shows differently."""
    run = WorkflowRun.objects.create_run(workflow, input={"order": 7, "items": ["tea", "cake"]})
    insert = WorkflowStep.objects.insert_step
    steps = {
        name: insert(run, name, f"shop.{name}", data={"n": 1}, retries=2)
        for name in ["pending", "live", "parked", "lapsed", "succeeded", "failed", "retried"]
    }
    claim(steps["live"])
    parked = claim(steps["parked"])
    assert WorkflowStep.objects.refresh_lease(parked.pk, None, parked.attempt)
    claim(steps["lapsed"])
    lapse(steps["lapsed"])
    done = claim(steps["succeeded"])
    WorkflowStep.objects.record_result(done.pk, {"charged": 12.5}, done.attempt)
    failed = claim(steps["failed"])
    WorkflowStep.objects.record_error(failed.pk, ValueError("card declined"), failed.attempt)
    claim(steps["retried"])
    lapse(steps["retried"])
    assert claim(steps["retried"]).attempt == 2
    return run, {name: WorkflowStep.objects.get(pk=step.pk) for name, step in steps.items()}


def finish(run: WorkflowRun, status: str, **fields: Any) -> None:
    WorkflowRun.objects.filter(pk=run.pk).update(status=status, wake_at=None, **fields)


class WorkflowAdminTestCase(TestCase):
    def setUp(self) -> None:
        self.user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(self.user)
        self.run, self.steps = build_run("order")
        self.done = WorkflowRun.objects.create_run("invoice")
        finish(self.done, "completed", output={"invoice": "INV-1"})
        self.broken = WorkflowRun.objects.create_run("invoice")
        finish(self.broken, "failed", error={"message": "no printer"})
        self.runs_url = reverse("admin:pikku_django_workflowrun_changelist")
        self.steps_url = reverse("admin:pikku_django_workflowstep_changelist")

    def get(self, url: str, data: dict[str, Any] | None = None) -> str:
        response = self.client.get(url, data)
        assert response.status_code == 200
        return response.content.decode()

    def count_queries(self, url: str) -> int:
        self.get(url)  # warm caches (content types, sessions)
        with CaptureQueriesContext(connection) as queries:
            self.get(url)
        return len(queries)


class WorkflowRunAdminTests(WorkflowAdminTestCase):
    def test_changelist_shows_runs_with_steps_done_age_and_wake(self) -> None:
        body = self.get(self.runs_url)
        assert str(self.run.pk)[:8] in body and str(self.done.pk)[:8] in body
        assert "1 / 7" in body  # one of the seven steps succeeded
        assert "0 / 0" in body  # the finished runs have none
        assert "due" in body
        assert "Wake selected runs" in body and "Cancel selected runs" in body

    def test_filters_and_search(self) -> None:
        body = self.get(self.runs_url, {"status": "completed"})
        assert str(self.done.pk)[:8] in body and str(self.run.pk)[:8] not in body
        body = self.get(self.runs_url, {"workflow": "order"})
        assert str(self.run.pk)[:8] in body and str(self.done.pk)[:8] not in body
        body = self.get(self.runs_url, {"q": str(self.done.pk)[:8]})
        assert str(self.done.pk)[:8] in body and str(self.run.pk)[:8] not in body
        body = self.get(self.runs_url, {"q": "invoice"})
        assert str(self.broken.pk)[:8] in body and str(self.run.pk)[:8] not in body
        # A whole id, dashes or not; a key exactly; never a substring.
        body = self.get(self.runs_url, {"q": str(self.done.pk)})
        assert str(self.done.pk)[:8] in body and str(self.run.pk)[:8] not in body
        body = self.get(self.runs_url, {"q": self.done.pk.hex.upper()})
        assert str(self.done.pk)[:8] in body and str(self.run.pk)[:8] not in body
        WorkflowRun.objects.filter(pk=self.run.pk).update(idempotency_key="order-77")
        body = self.get(self.runs_url, {"q": "order-77"})
        assert str(self.run.pk)[:8] in body and str(self.done.pk)[:8] not in body
        body = self.get(self.runs_url, {"q": "voic"})
        assert str(self.broken.pk)[:8] not in body

    def test_the_workflow_filter_lists_registered_workflows_without_reading_the_table(self) -> None:
        body = self.get(self.runs_url)
        assert "?workflow=test.double" in body
        with CaptureQueriesContext(connection) as queries:
            self.get(self.runs_url)
        assert not any("DISTINCT" in query["sql"].upper() for query in queries.captured_queries)

    def test_change_page_shows_steps_inline_and_pretty_json(self) -> None:
        body = self.get(reverse("admin:pikku_django_workflowrun_change", args=[self.run.pk]))
        for name in self.steps:
            assert f"shop.{name}" in body
        assert "parked" in body and "lapsed" in body
        assert "2 / 3" in body  # the retried step: attempt 2 of 3
        assert "<pre>{\n  &quot;items&quot;: [" in body
        step_url = reverse("admin:pikku_django_workflowstep_change", args=[self.steps["live"].pk])
        assert step_url in body
        assert 'name="workflow"' not in body

        body = self.get(reverse("admin:pikku_django_workflowrun_change", args=[self.broken.pk]))
        assert "no printer" in body

    def test_nothing_is_editable_by_hand(self) -> None:
        assert self.client.get(reverse("admin:pikku_django_workflowrun_add")).status_code == 403
        delete = reverse("admin:pikku_django_workflowrun_delete", args=[self.run.pk])
        assert self.client.post(delete, {"post": "yes"}).status_code == 403
        change = reverse("admin:pikku_django_workflowrun_change", args=[self.run.pk])
        assert self.client.post(change, {"workflow": "hacked", "status": "completed"}).status_code == 403
        assert WorkflowRun.objects.get(pk=self.run.pk).workflow == "order"

    def test_changelist_query_count_does_not_grow_with_runs(self) -> None:
        few = self.count_queries(self.runs_url)
        for i in range(27):
            run = WorkflowRun.objects.create_run(f"bulk-{i % 3}")
            WorkflowStep.objects.insert_step(run, "a", "shop.a")
            claim(WorkflowStep.objects.insert_step(run, "b", "shop.b"))
        assert WorkflowRun.objects.count() == 30
        many = self.count_queries(self.runs_url)
        assert many == few
        # Session, user, the page's count, the unfiltered count, the page; the
        # workflow filter's choices come from the registry, not the table.
        with self.assertNumQueries(5):
            self.client.get(self.runs_url)

    def test_change_page_query_count_does_not_grow_with_steps(self) -> None:
        url = reverse("admin:pikku_django_workflowrun_change", args=[self.run.pk])
        few = self.count_queries(url)
        for i in range(30):
            claim(WorkflowStep.objects.insert_step(self.run, f"more-{i}", "shop.more"))
        assert self.count_queries(url) == few

    def test_wake_action_makes_running_runs_due_and_skips_finished(self) -> None:
        WorkflowRun.objects.filter(pk=self.run.pk).update(wake_at=now_ms() + 630_000)
        assert "in 10 min" in self.get(self.runs_url)
        response = self.client.post(
            self.runs_url,
            {"action": "wake_runs", "_selected_action": [self.run.pk, self.done.pk]},
            follow=True,
        )
        assert response.status_code == 200
        assert "Woke 1 run. Skipped 1 not running." in response.content.decode()
        run = WorkflowRun.objects.get(pk=self.run.pk)
        assert run.wake_at is not None and run.wake_at <= now_ms()
        assert WorkflowRun.objects.due().filter(pk=self.run.pk).exists()
        done = WorkflowRun.objects.get(pk=self.done.pk)
        assert (done.status, done.wake_at) == ("completed", None)

    def test_wake_action_with_nothing_to_wake_warns(self) -> None:
        response = self.client.post(
            self.runs_url, {"action": "wake_runs", "_selected_action": [self.done.pk]}, follow=True
        )
        body = response.content.decode()
        assert "Woke 0 runs. Skipped 1 not running." in body
        assert 'class="warning"' in body

    def test_cancel_action_cancels_unfinished_runs_and_leaves_finished(self) -> None:
        suspended = WorkflowRun.objects.create_run("order")
        WorkflowRun.objects.filter(pk=suspended.pk).update(status="suspended")
        response = self.client.post(
            self.runs_url,
            {"action": "cancel_runs", "_selected_action": [self.run.pk, suspended.pk, self.done.pk]},
            follow=True,
        )
        assert "Cancelled 2 runs. Skipped 1 already finished." in response.content.decode()
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert statuses[self.run.pk] == "cancelled" and statuses[suspended.pk] == "cancelled"
        assert statuses[self.done.pk] == "completed"
        assert WorkflowRun.objects.get(pk=self.run.pk).wake_at is None

    def test_cancel_across_a_filtered_changelist(self) -> None:
        other = WorkflowRun.objects.create_run("refund")
        response = self.client.post(
            f"{self.runs_url}?workflow=order",
            {"action": "cancel_runs", "select_across": "1", "index": "0", "_selected_action": [self.run.pk]},
            follow=True,
        )
        assert "Cancelled 1 run." in response.content.decode()
        assert WorkflowRun.objects.get(pk=self.run.pk).status == "cancelled"
        assert WorkflowRun.objects.get(pk=other.pk).status == "running"

    def test_actions_need_the_change_permission(self) -> None:
        clerk = User.objects.create_user("clerk", "clerk@example.com", "pw", is_staff=True)
        clerk.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
        self.client.force_login(clerk)
        body = self.get(self.runs_url)
        assert "Wake selected runs" not in body
        self.client.post(self.runs_url, {"action": "cancel_runs", "_selected_action": [self.run.pk]})
        assert WorkflowRun.objects.get(pk=self.run.pk).status == "running"

        clerk.user_permissions.add(Permission.objects.get(codename="change_workflowrun"))
        clerk = User.objects.get(pk=clerk.pk)  # drop the permission cache
        self.client.force_login(clerk)
        assert "Wake selected runs" in self.get(self.runs_url)
        self.client.post(self.runs_url, {"action": "cancel_runs", "_selected_action": [self.run.pk]})
        assert WorkflowRun.objects.get(pk=self.run.pk).status == "cancelled"

    def test_display_methods(self) -> None:
        model_admin = WorkflowRunAdmin(WorkflowRun, site)
        run = WorkflowRun.objects.get(pk=self.run.pk)  # not annotated: reads the DB clock and counts
        assert model_admin.short_id(run) == str(run.pk)[:8]
        assert model_admin.steps_display(run) == "1 / 7"
        assert model_admin.wake_display(run) == "due"
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=now_ms() + 630_000)
        run.refresh_from_db()
        assert model_admin.wake_display(run).startswith("in 10 min ")
        now = now_ms()
        setattr(run, "db_now_ms", now)  # noqa: B010 - as get_queryset annotates it
        run.wake_at = now + 12_345
        assert model_admin.wake_display(run) == "in 12.3 s"
        run.wake_at = now
        assert model_admin.wake_display(run) == "due"
        assert model_admin.wake_display(WorkflowRun.objects.get(pk=self.done.pk)) == "-"
        assert model_admin.age(run).endswith(" ms") or model_admin.age(run).endswith(" s")
        assert "&quot;tea&quot;" in model_admin.input_json(run)
        assert model_admin.output_json(run) == "-"


class WorkflowStepAdminTests(WorkflowAdminTestCase):
    def test_changelist_shows_steps_with_run_link_and_lease(self) -> None:
        body = self.get(self.steps_url)
        for name in self.steps:
            assert f"shop.{name}" in body
        assert reverse("admin:pikku_django_workflowrun_change", args=[self.run.pk]) in body
        assert "parked" in body and "lapsed" in body and "2 / 3" in body

    def test_filter_and_search(self) -> None:
        body = self.get(self.steps_url, {"status": "failed"})
        assert "shop.failed" in body and "shop.live" not in body
        body = self.get(self.steps_url, {"q": "shop.parked"})
        assert "shop.parked" in body and "shop.live" not in body
        other, _ = build_run("refund")
        body = self.get(self.steps_url, {"q": str(other.pk)[:8]})
        assert str(other.pk)[:8] in body and str(self.run.pk)[:8] not in body

    def test_change_page_shows_attempts(self) -> None:
        step = self.steps["retried"]
        body = self.get(reverse("admin:pikku_django_workflowstep_change", args=[step.pk]))
        assert WorkflowStepAttempt.objects.filter(step=step).count() == 2
        assert body.count('class="field-attempt"') >= 2
        # Attempt 1 is still written as running: its worker was lost, and the page says so.
        assert WorkflowStepAttempt.objects.get(step=step, attempt=1).status == "running"
        assert body.count("lost worker") == 1

        lapsed = self.steps["lapsed"]
        body = self.get(reverse("admin:pikku_django_workflowstep_change", args=[lapsed.pk]))
        assert "lost worker" in body

        failed = self.steps["failed"]
        body = self.get(reverse("admin:pikku_django_workflowstep_change", args=[failed.pk]))
        assert "card declined" in body
        assert "builtins.ValueError" in body  # the step's whole error, as JSON
        assert 'name="step_name"' not in body

        done = self.steps["succeeded"]
        body = self.get(reverse("admin:pikku_django_workflowstep_change", args=[done.pk]))
        assert "12.5" in body

    def test_nothing_is_editable_by_hand(self) -> None:
        assert self.client.get(reverse("admin:pikku_django_workflowstep_add")).status_code == 403
        step = self.steps["live"]
        delete = reverse("admin:pikku_django_workflowstep_delete", args=[step.pk])
        assert self.client.post(delete, {"post": "yes"}).status_code == 403
        assert WorkflowStep.objects.filter(pk=step.pk).exists()

    def test_changelist_query_count_does_not_grow_with_steps(self) -> None:
        few = self.count_queries(self.steps_url)
        for i in range(10):
            build_run(f"bulk-{i}")
        assert WorkflowStep.objects.count() == 77
        assert self.count_queries(self.steps_url) == few
        # Session, user, the page's count, the unfiltered count, the page (runs joined).
        with self.assertNumQueries(5):
            self.client.get(self.steps_url)

    def test_change_page_query_count_does_not_grow_with_attempts(self) -> None:
        step = self.steps["retried"]
        url = reverse("admin:pikku_django_workflowstep_change", args=[step.pk])
        few = self.count_queries(url)
        lapse(step)
        assert claim(step).attempt == 3
        assert self.count_queries(url) == few

    def test_lease_left(self) -> None:
        model_admin = WorkflowStepAdmin(WorkflowStep, site)
        steps = self.steps  # fetched without the annotation: each reads the DB clock
        left = model_admin.lease_left(steps["live"])
        assert left.endswith(" s") and float(left.split()[0]) > 50
        assert model_admin.lease_left(steps["parked"]) == "parked"
        assert model_admin.lease_left(steps["lapsed"]) == "lapsed"
        assert model_admin.lease_left(steps["pending"]) == "-"
        assert model_admin.lease_left(steps["succeeded"]) == "-"
        # A lease that ends exactly now has lapsed.
        now = now_ms()
        live = steps["live"]
        live.lease_expires_at = now
        setattr(live, "db_now_ms", now)  # noqa: B010 - as get_queryset annotates it
        assert model_admin.lease_left(live) == "lapsed"
        live.lease_expires_at = now + 12_345
        assert model_admin.lease_left(live) == format_ms(12_345) == "12.3 s"

    def test_lease_left_on_the_annotated_queryset(self) -> None:
        request = self.client.get(self.steps_url).wsgi_request
        rows = {s.step_name: s for s in WorkflowStepAdmin(WorkflowStep, site).get_queryset(request)}
        assert all(isinstance(getattr(s, "db_now_ms", None), int) for s in rows.values())
        inline = WorkflowStepInline(WorkflowRun, site)
        assert inline.lease_left(rows["parked"]) == "parked"
        assert inline.lease_left(rows["lapsed"]) == "lapsed"
        assert inline.lease_left(rows["live"]).endswith(" s")

    def test_other_display_methods(self) -> None:
        model_admin = WorkflowStepAdmin(WorkflowStep, site)
        step = WorkflowStep.objects.select_related("run").get(pk=self.steps["retried"].pk)
        assert model_admin.attempt_display(step) == "2 / 3"
        link = model_admin.run_link(step)
        assert reverse("admin:pikku_django_workflowrun_change", args=[self.run.pk]) in link
        assert f"order {str(self.run.pk)[:8]}" in link
        assert model_admin.data_json(step) == "<pre>{\n  &quot;n&quot;: 1\n}</pre>"
        assert model_admin.error_json(step) == "-"

        attempts = WorkflowStepAttemptInline(WorkflowStep, site)
        failed = WorkflowStepAttempt.objects.get(step=self.steps["failed"], attempt=1)
        assert attempts.error_message(failed) == "card declined"
        assert attempts.result_display(failed) == "-"
        done = WorkflowStepAttempt.objects.get(step=self.steps["succeeded"], attempt=1)
        assert "12.5" in attempts.result_display(done)
        assert attempts.error_message(done) == "-"

"""
The admin's operating tools: "Retry selected runs" (task runs too), a fork
button per step, the dead letters one filter away, a timeline per run drawn
as SVG (one rendered-HTML check per kind of segment), and capped inlines.
"""

from __future__ import annotations

import datetime
import re

from django.contrib.auth.models import Permission, User
from django.test import TestCase
from django.urls import reverse

from pikku_django.admin.operate import INLINE_ROWS
from pikku_django.admin.timeline import KINDS, Bar, Segment, bars, render, run_timeline
from pikku_django.models import Lease, WorkflowRun, WorkflowSignal, WorkflowStep
from pikku_django.workflows import cancel_workflow, run_workflow, start_workflow
from testproject.testing import tasks
from tests.support.factories import lapse_step

T0 = datetime.datetime(2026, 12, 1, 9, 0, tzinfo=datetime.timezone.utc)


def at(ms: int) -> datetime.datetime:
    return T0 + datetime.timedelta(milliseconds=ms)


def attempt_row(step: str = "charge", attempt: int = 1, rpc: str = "shop.charge", **fields: object) -> dict:
    row: dict = {
        "step_id": step,
        "attempt": attempt,
        "status": "running",
        "holder": "w-1",
        "created_at": at(0),
        "running_at": None,
        "succeeded_at": None,
        "failed_at": None,
        "step__step_name": step,
        "step__rpc_name": rpc,
        "step__retry_delay": None,
    }
    row.update(fields)
    return row


def kinds(rows: list[dict], now_ms: int = 10_000) -> list[list[str]]:
    return [[s.kind for s in bar.segments] for bar in bars(rows, at(now_ms))]


class TimelineTests(TestCase):
    def test_each_kind_of_segment(self) -> None:
        # Queued, then running under a live lease.
        assert kinds([attempt_row(running_at=at(500))]) == [["queued", "running"]]
        # Succeeded and failed attempts.
        ok = attempt_row(status="succeeded", running_at=at(0), succeeded_at=at(900))
        assert kinds([ok]) == [["succeeded"]]
        # A lost worker (attempt 1 still "running" when attempt 2 took over), then a
        # failure, then a retry delay before attempt 3.
        rows = [
            attempt_row(attempt=1, running_at=at(0)),
            attempt_row(
                attempt=2, status="failed", created_at=at(3_000), running_at=at(3_000), failed_at=at(3_500)
            ),
            attempt_row(attempt=3, created_at=at(5_000), running_at=at(5_000), step__retry_delay=1_500),
        ]
        rows[1]["step__retry_delay"] = 1_500
        assert kinds(rows) == [["lost"], ["failed", "delay"], ["running"]]
        # A sleep, a signal wait and a child all wait.
        assert kinds([attempt_row("nap", rpc="pikku.sleep", status="scheduled")]) == [["sleep"]]
        assert kinds([attempt_row("go", rpc="pikku.wait_for_signal", status="suspended")]) == [["waiting"]]
        assert kinds([attempt_row("kid", rpc="pikku.workflow", running_at=at(10))]) == [["queued", "waiting"]]

    def test_the_svg_has_a_bar_per_attempt_with_times_and_worker_on_hover(self) -> None:
        drawn = [
            Bar(
                "charge #1",
                "w-1",
                [Segment("queued", at(0), at(1_000)), Segment("lost", at(1_000), at(4_000))],
            ),
            Bar("charge #2", "w-2", [Segment("succeeded", at(4_000), at(5_000))]),
        ]
        svg = str(render(drawn, at(0), at(5_000)))
        assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"')
        assert svg.count('<g class="pikku-bar">') == 2
        assert svg.count("<rect") == 3 + len(KINDS)  # the segments, then the legend
        assert (
            "<title>charge #1: lost worker 2026-12-01 09:00:01.000 to 2026-12-01 09:00:04.000 (3.0 s), "
            in svg
        )
        assert "worker w-1</title>" in svg and "worker w-2</title>" in svg
        # The axis runs over the whole span: the last segment ends at the plot's right edge.
        widths = [float(w) for w in re.findall(r'width="([\d.]+)" height="12"', svg)]
        assert abs(sum(widths) - 640) < 1
        assert "<script" not in svg

    def test_names_are_escaped(self) -> None:
        svg = str(render([Bar("<b>x</b> #1", "<i>", [Segment("running", at(0), at(1))])], at(0), at(1)))
        assert "<b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg

    def test_a_real_run(self) -> None:
        run = start_workflow("test.sleeper", {"ms": 60_000})
        run_workflow(run.pk)
        svg = str(run_timeline(WorkflowRun.objects.get(pk=run.pk)))
        assert "before #1: running (succeeded)" in svg and "nap #1: sleep" in svg
        assert str(run_timeline(WorkflowRun.objects.create_run("x"))) == "<p>No attempts yet.</p>"


class OperateAdminTests(TestCase):
    def setUp(self) -> None:
        self.user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(self.user)
        self.runs_url = reverse("admin:pikku_django_workflowrun_changelist")

    def get(self, url: str, data: dict | None = None) -> str:
        response = self.client.get(url, data)
        assert response.status_code == 200
        return response.content.decode()

    def test_retry_selected_runs_revives_failed_and_cancelled_ones(self) -> None:
        failed = start_workflow("test.fails", None, inline=True)
        cancelled = start_workflow("test.sleeper", {"ms": 60_000})
        cancel_workflow(cancelled.pk)
        done = start_workflow("test.double", 2, inline=True)
        running = start_workflow("test.double", 3)
        task = tasks.explode.enqueue("boom")
        run_workflow(task.id)
        selected = [failed.pk, cancelled.pk, done.pk, running.pk, task.id]
        response = self.client.post(
            self.runs_url, {"action": "retry_runs", "_selected_action": selected}, follow=True
        )
        assert "Retried 3 runs. Skipped 2 not failed or cancelled." in response.content.decode()
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert [statuses[pk] for pk in (failed.pk, cancelled.pk, done.pk, running.pk)] == [
            "running",
            "running",
            "completed",
            "running",
        ]
        task.refresh()
        assert str(task.status) == "READY"

    def test_retry_needs_the_change_permission(self) -> None:
        failed = start_workflow("test.fails", None, inline=True)
        clerk = User.objects.create_user("clerk", "clerk@example.com", "pw", is_staff=True)
        clerk.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
        self.client.force_login(clerk)
        assert "Retry selected runs" not in self.get(self.runs_url)
        self.client.post(self.runs_url, {"action": "retry_runs", "_selected_action": [failed.pk]})
        assert WorkflowRun.objects.get(pk=failed.pk).status == "failed"
        fork = reverse("admin:pikku_django_workflowrun_fork", args=[failed.pk])
        assert self.client.post(fork, {"from_step": ""}).status_code == 403

    def test_the_dead_letters_filter(self) -> None:
        failed = start_workflow("test.fails", None, inline=True)
        cancelled = start_workflow("test.double", 1)
        cancel_workflow(cancelled.pk)
        done = start_workflow("test.double", 2, inline=True)
        running = start_workflow("test.double", 3)
        body = self.get(self.runs_url, {"status": "dead"})
        assert "dead letters (failed or cancelled)" in body
        for run, shown in ((failed, True), (cancelled, True), (done, False), (running, False)):
            assert (str(run.pk)[:8] in body) is shown, run.status
        body = self.get(self.runs_url, {"status": "completed"})
        assert str(done.pk)[:8] in body and str(failed.pk)[:8] not in body
        body = self.get(self.runs_url, {"status__exact": "failed"})
        assert str(failed.pk)[:8] in body and str(done.pk)[:8] not in body

    def test_fork_from_a_step_on_the_run_page(self) -> None:
        run = start_workflow("test.steps", {"steps": 3}, inline=True)
        page = self.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
        url = reverse("admin:pikku_django_workflowrun_fork", args=[run.pk])
        # One per step, and the summary's "Fork from the start".
        assert page.count(f'formaction="{url}"') == 4
        assert 'name="from_step" value="s1"' in page and "csrfmiddlewaretoken" in page
        assert '<svg xmlns="http://www.w3.org/2000/svg"' in page
        response = self.client.post(url, {"from_step": "s1"})
        fork = WorkflowRun.objects.exclude(pk=run.pk).get()
        assert response.status_code == 302
        assert response["Location"] == reverse("admin:pikku_django_workflowrun_change", args=[fork.pk])
        assert fork.forked_from_id == run.pk
        assert list(fork.steps.values_list("step_name", flat=True)) == ["s0"]
        # An unknown step is an error message on the run's page; a GET changes nothing.
        response = self.client.post(url, {"from_step": "nope"}, follow=True)
        assert "has no step &#x27;nope&#x27;" in response.content.decode()
        assert self.client.get(url).status_code == 405
        assert WorkflowRun.objects.count() == 2

    def test_inlines_are_capped_with_a_link_to_the_whole_list(self) -> None:
        run = start_workflow("test.signals", {"name": "go", "waits": 1})
        for i in range(INLINE_ROWS + 10):
            WorkflowStep.objects.insert_step(run, f"step-{i:03}", "shop.step")
        WorkflowSignal.objects.bulk_create(
            WorkflowSignal(run=run, name="go", sent_at=Lease.objects.db_now_ms())
            for _ in range(INLINE_ROWS + 5)
        )
        url = reverse("admin:pikku_django_workflowrun_change", args=[run.pk])
        with self.assertNumQueries(self.queries(url)):
            body = self.get(url)
        assert 'value="step-049"' in body and 'value="step-050"' not in body  # one fork button a row
        assert body.count("<tr") < 2 * INLINE_ROWS + 20
        steps_url = reverse("admin:pikku_django_workflowstep_changelist")
        signals_url = reverse("admin:pikku_django_workflowsignal_changelist")
        for total, what, listed in (
            (INLINE_ROWS + 10, "steps", steps_url),
            (INLINE_ROWS + 5, "signals", signals_url),
        ):
            link = f'<a href="{listed}?run__id__exact={run.pk}">all of them</a>'
            assert f"Showing the first {INLINE_ROWS} of {total} {what}: {link}" in body
        other = start_workflow("test.double", 1)
        WorkflowStep.objects.insert_step(other, "elsewhere", "shop.step")
        listed = self.get(steps_url, {"run__id__exact": str(run.pk)})
        assert "step-059" in listed and "elsewhere" not in listed
        assert "60 workflow steps" in listed
        assert "55 workflow signals" in self.get(signals_url, {"run__id__exact": str(run.pk)})

    def queries(self, url: str) -> int:
        """The queries of a run page now; adding rows past the cap must not add any."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        # Once first, so that what a process reads once and keeps (content
        # types) is read whichever test this worker ran before.
        self.client.get(url)
        with CaptureQueriesContext(connection) as captured:
            self.client.get(url)
        return len(captured)

    def test_lost_worker_on_a_real_run_page(self) -> None:
        run = start_workflow("test.steps", {"steps": 1})
        step = WorkflowStep.objects.start_step(
            run.pk, "s0", "testproject.testing.workflows.plain_step", 60_000, holder="w-dead"
        )
        assert step is not None
        lapse_step(step)
        assert run_workflow(run.pk, holder="w-next").status == "completed"
        body = self.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
        assert "s0 #1: lost worker" in body and "worker w-dead</title>" in body
        assert "s0 #2: running (succeeded)" in body

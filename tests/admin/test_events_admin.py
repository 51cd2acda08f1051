"""The run page shows a run's latest events and the tail of each stream, in a bounded number of queries."""

from __future__ import annotations

import threading

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows.current import StepHandle


class EventsOnTheRunPageTests(TestCase):
    def setUp(self) -> None:
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.run = WorkflowRun.objects.create_run("order")
        step = WorkflowStep.objects.insert_step(self.run, "report", "shop.report")
        WorkflowStep.objects.claim(self.run.pk, "report", "shop.report", 60_000)
        self.handle = StepHandle(
            self.run.pk, "report", 1, threading.Event(), step_id=step.pk, using="default"
        )
        self.url = reverse("admin:pikku_django_workflowrun_change", args=[self.run.pk])

    def body(self) -> str:
        response = self.client.get(self.url)
        assert response.status_code == 200
        return response.content.decode()

    def queries(self) -> int:
        self.body()
        with CaptureQueriesContext(connection) as captured:
            self.body()
        return len(captured)

    def test_latest_events_and_stream_tails(self) -> None:
        self.handle.set_event("progress", {"done": 1})
        self.handle.set_event("progress", {"done": 2})
        for i in range(30):
            self.handle.publish("log", f"line-{i:02}")
        body = self.body()
        assert "Events and streams" in body
        assert "progress" in body and "&quot;done&quot;: 2" in body and "&quot;done&quot;: 1" not in body
        assert "30 items, the last 5" in body
        assert "line-29" in body and "line-25" in body and "line-24" not in body

    def test_the_queries_do_not_grow_with_items_or_events(self) -> None:
        self.handle.publish("log", "first")
        self.handle.set_event("a", 1)
        few = self.queries()
        for i in range(50):
            self.handle.publish("log", i)
            self.handle.set_event(f"k{i}", i)
        assert self.queries() == few

    def test_a_run_that_told_nothing_shows_the_empty_value(self) -> None:
        assert "Events and streams" in self.body()

"""The keeper renews the leases due together in one statement per table."""

from __future__ import annotations

from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext

from pikku_django.leases import LeaseRenewal
from pikku_django.models import Lease, WorkflowStep
from pikku_django.workflows.context import StepLeaseRenewal
from tests.support.factories import lapse, lapse_step, make_run, make_step


class LeaseBatchTests(TestCase):
    def renewals(self, n: int) -> list[LeaseRenewal]:
        leases = [Lease.objects.acquire(f"k{i}", "me", 1_000) for i in range(n)]
        return [LeaseRenewal(lease, 60_000, "default") for lease in leases if lease is not None]

    def test_leases_due_together_are_renewed_by_one_update(self) -> None:
        renewals = self.renewals(3)
        floor = Lease.objects.db_now_ms() + 50_000
        with CaptureQueriesContext(connection) as queries:
            assert LeaseRenewal.renew_all(renewals) == [True, True, True]
        assert len(queries) == 1
        assert all(lease.expires_at > floor for lease in Lease.objects.all())

    def test_a_lost_lease_in_the_batch_is_found_one_by_one(self) -> None:
        renewals = self.renewals(3)
        lapse("k1")
        assert Lease.objects.acquire("k1", "other", 60_000) is not None
        assert LeaseRenewal.renew_all(renewals) == [True, False, True]
        assert Lease.objects.current("k1").holder == "other"


class StepLeaseBatchTests(TestCase):
    def renewals(self, n: int) -> list[StepLeaseRenewal]:
        run = make_run()
        steps = []
        for i in range(n):
            step = make_step(run, step_name=f"s{i}")
            claimed = WorkflowStep.objects.claim(run.pk, step.step_name, step.rpc_name, 1_000)
            assert claimed is not None
            steps.append(claimed)
        return [StepLeaseRenewal(step, 60_000, "default") for step in steps]

    def test_step_leases_due_together_are_renewed_by_one_update(self) -> None:
        renewals = self.renewals(4)
        floor = Lease.objects.db_now_ms() + 50_000
        with CaptureQueriesContext(connection) as queries:
            assert StepLeaseRenewal.renew_all(renewals) == [True] * 4
        assert len(queries) == 1
        assert all(step.lease_expires_at > floor for step in WorkflowStep.objects.all())

    def test_a_superseded_attempt_in_the_batch_is_found_one_by_one(self) -> None:
        renewals = self.renewals(3)
        step = WorkflowStep.objects.get(step_name="s2")
        lapse_step(step)
        assert WorkflowStep.objects.claim(step.run_id, "s2", step.rpc_name, 60_000).attempt == 2
        assert StepLeaseRenewal.renew_all(renewals) == [True, True, False]

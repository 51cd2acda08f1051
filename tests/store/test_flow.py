"""
Rate limits (``PIKKU_QUEUES[q]["rate"]``): GCRA buckets advanced by one
guarded UPDATE on the database clock; a run over the limit is made due at
the next permitted instant and runs then; the DB-clock start times satisfy
``t[i + limit + burst] − t[i] ≥ period_ms``.
"""

from __future__ import annotations

from django.test import SimpleTestCase, TransactionTestCase, override_settings

from pikku_django.checks import QUEUES_CHECK_ID, check_queues
from pikku_django.models import FlowBucket, Lease, WorkflowRun
from pikku_django.store.flow import admit, bucket_key
from pikku_django.worker import Worker
from pikku_django.workflows import start_workflow
from testproject.testing.models import StepCall
from tests.support.children import poll_until

RATED = {"rated": {"rate": {"limit": 2, "period_ms": 400, "burst": 1}}}
PER_KEY_RATE = {"rated": {"rate": {"limit": 1, "period_ms": 60_000, "per_key": True}}}


def now_ms() -> int:
    return Lease.objects.db_now_ms()


class AdmitTests(TransactionTestCase):
    def test_burst_plus_one_at_once_then_one_per_interval(self) -> None:
        # limit 2 per 1000 ms, burst 1: an interval of 500 ms, a tolerance of 500.
        before = now_ms()
        assert admit("default", "b", 2, 1000, 1) is None
        assert admit("default", "b", 2, 1000, 1) is None
        at = admit("default", "b", 2, 1000, 1)
        assert at is not None
        tat = FlowBucket.objects.get(key="b").tat
        assert at == tat - 500
        assert before + 500 <= at <= now_ms() + 500
        # Refused, the bucket is unchanged.
        assert admit("default", "b", 2, 1000, 1) == at
        FlowBucket.objects.filter(key="b").update(tat=now_ms() - 10_000)
        assert admit("default", "b", 2, 1000, 1) is None

    def test_buckets_are_per_queue_or_per_key(self) -> None:
        rate = {"limit": 1, "period_ms": 1000}
        assert bucket_key("q", "t1", rate) == bucket_key("q", "t2", rate) == "rate:q"
        per_key = {**rate, "per_key": True}
        assert bucket_key("q", "t1", per_key) != bucket_key("q", "t2", per_key)
        assert bucket_key("q", None, per_key) == "rate:q"
        assert len(bucket_key("q" * 100, "k" * 255, per_key)) <= 255


@override_settings(PIKKU_QUEUES=RATED)
class RateWorkerTests(TransactionTestCase):
    def test_every_run_finishes_and_db_clock_starts_keep_the_rate(self) -> None:
        runs = [start_workflow("test.steps", {"steps": 1}, queue="rated") for _ in range(8)]
        done = WorkflowRun.objects.filter(status="completed")

        def drained() -> bool:
            Worker(holder="w", once=True).run()
            return done.count() == len(runs)

        poll_until(drained, timeout=30, interval=0.05)
        starts = sorted(WorkflowRun.objects.values_list("rate_at", flat=True))
        limit, burst, period = 2, 1, 400
        gaps = [starts[i + limit + burst] - starts[i] for i in range(len(starts) - limit - burst)]
        assert min(gaps) >= period, starts
        # Each run's step ran after its admission.
        for run in WorkflowRun.objects.all():
            (called,) = StepCall.objects.filter(run_id=run.pk).values_list("at_ms", flat=True)
            assert run.rate_at is not None and called >= run.rate_at

    @override_settings(PIKKU_QUEUES={"rated": {"rate": {"limit": 2, "period_ms": 20_000, "burst": 1}}})
    def test_a_run_over_the_limit_is_due_at_the_next_permitted_instant(self) -> None:
        # An interval of 10 s and a tolerance of 10 s: two start at once, the third waits.
        runs = [start_workflow("test.steps", {"steps": 1}, queue="rated") for _ in range(3)]
        Worker(holder="w", once=True).run()
        statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
        assert sorted(statuses[r.pk] for r in runs) == ["completed", "completed", "running"]
        waiting = WorkflowRun.objects.get(status="running")
        tat = FlowBucket.objects.get(key="rate:rated").tat
        assert waiting.wake_at == tat - 10_000 > now_ms()
        assert waiting.rate_at is None

    def test_a_second_pass_of_a_run_is_not_counted_again(self) -> None:
        run = start_workflow("test.sleeper", {"ms": 1}, queue="rated")
        poll_until(lambda: Worker(holder="w", once=True).run() == 0 and _status(run) == "completed", 30)
        # Its passes took one place of the bucket: one interval (200 ms) past
        # its admission (the bucket's now a statement later), not two.
        run.refresh_from_db()
        assert run.rate_at is not None
        assert 200 <= FlowBucket.objects.get(key="rate:rated").tat - run.rate_at < 400


@override_settings(PIKKU_QUEUES=PER_KEY_RATE)
class PerKeyRateTests(TransactionTestCase):
    def test_each_key_has_its_own_bucket(self) -> None:
        for key in ("a", "b"):
            for _ in range(3):
                start_workflow("test.steps", {"steps": 1}, queue="rated", key=key)
        Worker(holder="w", once=True).run()
        done = WorkflowRun.objects.filter(status="completed")
        assert sorted(done.values_list("key", flat=True)) == ["a", "b"]
        later = now_ms() + 50_000
        assert all(
            w > later for w in WorkflowRun.objects.filter(status="running").values_list("wake_at", flat=True)
        )


def _status(run: WorkflowRun) -> str:
    return WorkflowRun.objects.get(pk=run.pk).status


class RateCheckTests(SimpleTestCase):
    databases = {"default"}

    def test_good_rates_pass(self) -> None:
        for good in [RATED, PER_KEY_RATE, {"q": {"rate": {"limit": 5, "period_ms": 1000, "burst": 0}}}]:
            with override_settings(PIKKU_QUEUES=good):
                assert check_queues() == [], good

    def test_bad_rates_name_the_setting_key(self) -> None:
        for rate, named in [
            (5, "PIKKU_QUEUES['q']['rate']"),
            ({"limit": 5}, "PIKKU_QUEUES['q']['rate']"),
            ({"limit": 0, "period_ms": 10}, "PIKKU_QUEUES['q']['rate']['limit']"),
            ({"limit": 1, "period_ms": True}, "PIKKU_QUEUES['q']['rate']['period_ms']"),
            ({"limit": 1, "period_ms": 10, "burst": -1}, "PIKKU_QUEUES['q']['rate']['burst']"),
            ({"limit": 1, "period_ms": 10, "per_key": "yes"}, "PIKKU_QUEUES['q']['rate']['per_key']"),
            ({"limit": 1, "period_ms": 10, "every": 1}, "PIKKU_QUEUES['q']['rate']"),
        ]:
            with override_settings(PIKKU_QUEUES={"q": {"rate": rate}}):
                errors = check_queues()
            assert [e.id for e in errors] == [QUEUES_CHECK_ID], rate
            assert named in errors[0].msg, errors[0].msg

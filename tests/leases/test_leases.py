"""The Lease.objects contract, on whichever database DATABASE_URL names."""

from __future__ import annotations

import datetime
from unittest import skipUnless

import pytest
from django.db import connection, connections, transaction
from django.test import TestCase, TransactionTestCase

from pikku_django.errors import LeaseInTransactionError, PikkuError
from pikku_django.models import Lease, WorkflowRun, WorkflowStep
from tests.support.factories import lapse

TTL = 60_000


class LeaseContractTests(TestCase):
    def test_new_key_gets_token_one(self) -> None:
        before = Lease.objects.db_now_ms()
        lease = Lease.objects.acquire("k", "a", TTL)
        after = Lease.objects.db_now_ms()
        assert lease is not None
        assert (lease.key, lease.holder, lease.token) == ("k", "a", 1)
        assert before + TTL <= lease.expires_at <= after + TTL
        assert lease.expires == datetime.datetime.fromtimestamp(
            lease.expires_at / 1000, tz=datetime.timezone.utc
        )

    def test_live_lease_refuses_another_holder(self) -> None:
        held = Lease.objects.acquire("k", "a", TTL)
        assert Lease.objects.acquire("k", "b", TTL) is None
        row = Lease.objects.get(key="k")
        assert (row.holder, row.token, row.expires_at) == ("a", 1, held.expires_at)

    def test_live_holder_reacquiring_keeps_token_and_sets_expiry(self) -> None:
        first = Lease.objects.acquire("k", "a", TTL)
        again = Lease.objects.acquire("k", "a", TTL * 2)
        assert again is not None and again.token == first.token == 1
        assert again.expires_at > first.expires_at
        # Even a shorter ttl is taken as asked: the expiry becomes now + ttl.
        shorter = Lease.objects.acquire("k", "a", 1_000)
        assert shorter is not None and shorter.token == 1
        assert shorter.expires_at < again.expires_at

    def test_lapsed_lease_retaken_raises_token_and_fences_old_holder(self) -> None:
        old = Lease.objects.acquire("k", "a", TTL)
        lapse("k")
        new = Lease.objects.acquire("k", "b", TTL)
        assert new is not None and (new.holder, new.token) == ("b", 2)
        assert Lease.objects.refresh(old, TTL) is None
        assert Lease.objects.current("k").token == 2

    def test_lapsed_lease_retaken_by_same_holder_raises_token(self) -> None:
        Lease.objects.acquire("k", "a", TTL)
        lapse("k")
        again = Lease.objects.acquire("k", "a", TTL)
        assert again is not None and again.token == 2

    def test_release_lapses_and_next_holder_gets_higher_token(self) -> None:
        lease = Lease.objects.acquire("k", "a", TTL)
        assert Lease.objects.release(lease) is True
        assert Lease.objects.current("k") is None
        row = Lease.objects.get(key="k")
        assert row.token == 1 and row.expires_at <= Lease.objects.db_now_ms()
        nxt = Lease.objects.acquire("k", "b", TTL)
        assert nxt is not None and nxt.token == 2

    def test_old_holders_release_after_hand_over_changes_nothing(self) -> None:
        old = Lease.objects.acquire("k", "a", TTL)
        lapse("k")
        new = Lease.objects.acquire("k", "b", TTL)
        assert Lease.objects.release(old) is False
        assert Lease.objects.current("k").token == new.token
        assert Lease.objects.get(key="k").expires_at == new.expires_at

    def test_same_holder_old_token_release_changes_nothing(self) -> None:
        old = Lease.objects.acquire("k", "a", TTL)
        lapse("k")
        new = Lease.objects.acquire("k", "a", TTL)
        assert Lease.objects.release(old) is False
        assert Lease.objects.current("k") == new
        assert Lease.objects.get(key="k").expires_at == new.expires_at

    def test_release_of_a_lapsed_lease_says_false_and_changes_nothing(self) -> None:
        lease = Lease.objects.acquire("k", "a", TTL)
        lapse("k", ago_ms=5_000)
        expired_at = Lease.objects.get(key="k").expires_at
        assert Lease.objects.release(lease) is False
        assert Lease.objects.get(key="k").expires_at == expired_at

    def test_second_release_says_false(self) -> None:
        lease = Lease.objects.acquire("k", "a", TTL)
        assert Lease.objects.release(lease) is True
        assert Lease.objects.release(lease) is False
        assert Lease.objects.get(key="k").token == 1

    def test_refresh_keeps_token_and_extends_expiry(self) -> None:
        lease = Lease.objects.acquire("k", "a", 1_000)
        renewed = Lease.objects.refresh(lease, TTL)
        assert renewed is not None
        assert renewed.token == lease.token and renewed.holder == "a"
        assert renewed.expires_at > lease.expires_at
        assert Lease.objects.get(key="k").expires_at == renewed.expires_at

    def test_refresh_of_lapsed_lease_is_refused_even_if_untaken(self) -> None:
        lease = Lease.objects.acquire("k", "a", TTL)
        lapse("k")
        assert Lease.objects.refresh(lease, TTL) is None
        assert Lease.objects.current("k") is None

    def test_refresh_of_released_lease_is_refused(self) -> None:
        lease = Lease.objects.acquire("k", "a", TTL)
        Lease.objects.release(lease)
        assert Lease.objects.refresh(lease, TTL) is None

    def test_current(self) -> None:
        assert Lease.objects.current("k") is None
        lease = Lease.objects.acquire("k", "a", TTL)
        assert Lease.objects.current("k") == lease
        assert Lease.objects.current("k").holder == "a"
        lapse("k")
        assert Lease.objects.current("k") is None

    def test_keys_and_holders_compare_exactly(self) -> None:
        # MySQL's default collations fold case and trailing spaces.
        assert Lease.objects.acquire("Report:1", "worker", TTL) is not None
        assert Lease.objects.acquire("report:1", "other", TTL) is not None
        assert Lease.objects.acquire("report:1 ", "third", TTL) is not None
        assert Lease.objects.acquire("Report:1", "WORKER", TTL) is None
        assert Lease.objects.acquire("Report:1", "worker ", TTL) is None
        assert Lease.objects.count() == 3

    def test_unicode_key_and_holder_round_trip(self) -> None:
        lease = Lease.objects.acquire("rapport:ä€😀", "työläinen", TTL)
        assert lease is not None and lease.key == "rapport:ä€😀"
        assert Lease.objects.current("rapport:ä€😀").holder == "työläinen"

    def test_db_now_ms_is_close_to_wall_clock(self) -> None:
        import time

        assert abs(Lease.objects.db_now_ms() - time.time() * 1000) < 60_000

    def test_live_and_lapsed_querysets(self) -> None:
        Lease.objects.acquire("live", "a", TTL)
        Lease.objects.acquire("gone", "a", TTL)
        lapse("gone")
        assert list(Lease.objects.live().values_list("key", flat=True)) == ["live"]
        assert list(Lease.objects.lapsed().values_list("key", flat=True)) == ["gone"]

    def test_expire_keeps_token(self) -> None:
        lease = Lease.objects.acquire("k", "a", TTL)
        assert Lease.objects.filter(key="k").expire() == 1
        assert Lease.objects.filter(key="k").expire() == 0
        assert Lease.objects.refresh(lease, TTL) is None
        assert Lease.objects.acquire("k", "b", TTL).token == 2


class BadInputTests(TestCase):
    def assert_refused(self, argument: str, call) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(ValueError, match=argument) as info:
            call()
        assert isinstance(info.value, PikkuError)
        assert not Lease.objects.exists()

    def test_keys(self) -> None:
        for key in ["", "x" * 256, None, 7, b"k"]:
            self.assert_refused("key", lambda key=key: Lease.objects.acquire(key, "a", TTL))
        self.assert_refused("key", lambda: Lease.objects.current(""))
        assert Lease.objects.acquire("x" * 255, "a", TTL) is not None

    def test_holders(self) -> None:
        for holder in ["", "h" * 256, None]:
            self.assert_refused("holder", lambda holder=holder: Lease.objects.acquire("k", holder, TTL))

    def test_ttls(self) -> None:
        for ttl in [0, -1, True, False, 1.5, "100", None]:
            self.assert_refused("ttl_ms", lambda ttl=ttl: Lease.objects.acquire("k", "a", ttl))
        lease = Lease.objects.acquire("k", "a", TTL)
        with pytest.raises(ValueError, match="ttl_ms"):
            Lease.objects.refresh(lease, 0)


class TransactionPolicyTests(TransactionTestCase):
    """Lease operations commit on their own; inside atomic() they are refused."""

    def test_refused_inside_atomic(self) -> None:
        with transaction.atomic(), pytest.raises(LeaseInTransactionError):
            Lease.objects.acquire("k", "a", TTL)
        lease = Lease.objects.acquire("k", "a", TTL)
        with transaction.atomic():
            with pytest.raises(LeaseInTransactionError):
                Lease.objects.refresh(lease, TTL)
            with pytest.raises(LeaseInTransactionError):
                Lease.objects.release(lease)
        assert Lease.objects.current("k") == lease

    def test_refused_with_autocommit_off(self) -> None:
        transaction.set_autocommit(False)
        try:
            with pytest.raises(LeaseInTransactionError):
                Lease.objects.acquire("k", "a", TTL)
        finally:
            transaction.rollback()
            transaction.set_autocommit(True)

    def test_committed_and_visible_to_another_connection(self) -> None:
        lease = Lease.objects.acquire("k", "a", TTL)
        other = connection.copy()
        try:
            with other.cursor() as cursor:
                cursor.execute(
                    "SELECT holder, token FROM pikku_lease WHERE " + other.ops.quote_name("key") + " = %s",
                    ["k"],
                )
                assert cursor.fetchone() == ("a", lease.token)
        finally:
            other.close()


@skipUnless(connection.vendor == "postgresql", "server-side binding is a psycopg 3 option")
class ServerSideBindingTests(TransactionTestCase):
    """Projects may set OPTIONS["server_side_binding"]: every statement must type its parameters."""

    def setUp(self) -> None:
        ssb = connection.copy(alias="ssb")
        ssb.settings_dict["OPTIONS"]["server_side_binding"] = True
        connections["ssb"] = ssb
        self.addCleanup(lambda: connections.__delitem__("ssb"))
        self.addCleanup(lambda: connections["ssb"].close())

    def test_lease_and_step_operations(self) -> None:
        leases = Lease.objects.db_manager("ssb")
        lease = leases.acquire("k", "a", TTL)
        assert lease is not None and lease.token == 1
        assert leases.acquire("k", "b", TTL) is None
        assert leases.refresh(lease, TTL) is not None
        assert leases.current("k").holder == "a"
        leases.release(lease)
        assert leases.acquire("k", "b", TTL).token == 2
        run = WorkflowRun.objects.db_manager("ssb").create_run("order")
        step = WorkflowStep.objects.db_manager("ssb").insert_step(run, "charge", "shop.charge")
        claimed = WorkflowStep.objects.db_manager("ssb").claim(run.pk, "charge", "shop.charge", TTL)
        assert claimed is not None and claimed.pk == step.pk

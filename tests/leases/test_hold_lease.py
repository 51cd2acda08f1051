"""hold_lease(): renewal, loss, release, and what the body sees."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError, connections
from django.test import TransactionTestCase, override_settings

from pikku_django.errors import LeaseLostError, LeaseTakenError
from pikku_django.leases import default_holder, hold_lease
from pikku_django.managers import LeaseManager
from pikku_django.models import Lease
from tests.support.factories import lapse

real_refresh = LeaseManager.refresh
real_release = LeaseManager.release


def patch_refresh(fn: Callable[..., Any]) -> Any:
    """Route every renewal through ``fn(real, self, lease, ttl_ms)``."""

    def refresh(self: LeaseManager, lease: Lease, ttl_ms: int) -> Lease | None:
        return fn(real_refresh, self, lease, ttl_ms)

    return mock.patch.object(LeaseManager, "refresh", refresh)


class HoldLeaseTests(TransactionTestCase):
    def test_holds_renews_and_releases(self) -> None:
        renewed = threading.Event()
        calls: list[int] = []

        def counting(real: Any, self: LeaseManager, lease: Lease, ttl_ms: int) -> Lease | None:
            result = real(self, lease, ttl_ms)
            calls.append(result.expires_at)
            renewed.set()
            return result

        with patch_refresh(counting), hold_lease("report:1", ttl_ms=300, holder="me") as held:
            assert held.token == 1 and held.key == "report:1"
            first_expiry = Lease.objects.get(key="report:1").expires_at
            assert renewed.wait(timeout=10)
            assert Lease.objects.current("report:1").holder == "me"
            assert Lease.objects.get(key="report:1").expires_at > first_expiry or calls[0] >= first_expiry
            assert not held.lost.is_set()
            held.check()
        assert Lease.objects.current("report:1") is None
        assert Lease.objects.get(key="report:1").token == 1

    def test_default_ttl_and_holder(self) -> None:
        with override_settings(PIKKU_LEASE_TTL_MS=45_000), hold_lease("k") as held:
            lease = Lease.objects.current("k")
            now = Lease.objects.db_now_ms()
            assert now < lease.expires_at <= now + 45_000
            assert lease.holder.count(":") >= 2 and lease.holder == held.lease.holder
        assert len(default_holder()) <= 255 and default_holder() != default_holder()

    def test_taken_raises_at_once(self) -> None:
        Lease.objects.acquire("k", "someone-else", 60_000)
        started = time.monotonic()
        with pytest.raises(LeaseTakenError) as info, hold_lease("k", ttl_ms=60_000):
            pytest.fail("the body must not run")
        assert time.monotonic() - started < 2
        assert info.value.key == "k"
        assert Lease.objects.current("k").holder == "someone-else"

    def test_lost_to_another_holder(self) -> None:
        with pytest.raises(LeaseLostError), hold_lease("k", ttl_ms=600, holder="me") as held:
            lapse("k")
            assert Lease.objects.acquire("k", "thief", 60_000).token == 2
            assert held.lost.wait(timeout=10)
            with pytest.raises(LeaseLostError):
                held.check()
        # The thief's lease is untouched by our exit.
        assert Lease.objects.current("k").holder == "thief"

    def test_lost_raises_on_exit_even_when_body_succeeds(self) -> None:
        done = []
        with pytest.raises(LeaseLostError), hold_lease("k", ttl_ms=600, holder="me") as held:
            lapse("k")
            Lease.objects.acquire("k", "thief", 60_000)
            held.lost.wait(timeout=10)
            done.append(True)
        assert done == [True]

    def test_body_exception_propagates_and_lease_is_released(self) -> None:
        with pytest.raises(ZeroDivisionError), hold_lease("k", ttl_ms=60_000):
            1 / 0  # noqa: B018
        assert Lease.objects.current("k") is None

    def test_renewals_failing_for_less_than_ttl_do_not_lose_it(self) -> None:
        calls: list[str] = []
        third = threading.Event()

        def flaky(real: Any, self: LeaseManager, lease: Lease, ttl_ms: int) -> Lease | None:
            calls.append("call")
            if len(calls) == 1:
                raise OperationalError("database unreachable")
            result = real(self, lease, ttl_ms)
            if len(calls) >= 3:
                third.set()
            return result

        with patch_refresh(flaky), hold_lease("k", ttl_ms=3_000, holder="me") as held:
            assert third.wait(timeout=20)
            assert not held.lost.is_set()
            held.check()
        assert Lease.objects.get(key="k").token == 1

    def test_renewals_failing_for_good_lose_it_once_ttl_passed(self) -> None:
        ttl_ms = 900
        started = time.monotonic()

        def down(real: Any, self: LeaseManager, lease: Lease, ttl_ms: int) -> Lease | None:
            raise OperationalError("database unreachable")

        with pytest.raises(LeaseLostError), patch_refresh(down), hold_lease("k", ttl_ms=ttl_ms) as held:
            assert held.lost.wait(timeout=20)
            assert time.monotonic() - started >= ttl_ms / 1000

    def test_stop_waits_for_renewal_in_flight_before_release(self) -> None:
        in_flight = threading.Event()
        may_finish = threading.Event()
        order: list[str] = []

        def slow(real: Any, self: LeaseManager, lease: Lease, ttl_ms: int) -> Lease | None:
            if order:
                return real(self, lease, ttl_ms)
            order.append("renew-start")
            in_flight.set()
            may_finish.wait(timeout=20)
            result = real(self, lease, ttl_ms)
            order.append("renew-end")
            return result

        def release(self: LeaseManager, lease: Lease) -> bool:
            order.append("release")
            return real_release(self, lease)

        with patch_refresh(slow), mock.patch.object(LeaseManager, "release", release):
            with hold_lease("k", ttl_ms=3_000) as held:
                assert in_flight.wait(timeout=10)
                threading.Timer(0.2, may_finish.set).start()
            assert order[:3] == ["renew-start", "renew-end", "release"]
            assert not held.lost.is_set()
        assert Lease.objects.current("k") is None

    def test_released_and_retaken_before_any_renewal_raises_on_exit(self) -> None:
        # An hour-long ttl: no renewal runs while the body does, so only the
        # release on exit can notice that the lease changed hands.
        renewals: list[int] = []

        def counting(real: Any, self: LeaseManager, lease: Lease, ttl_ms: int) -> Lease | None:
            renewals.append(1)
            return real(self, lease, ttl_ms)

        with (
            patch_refresh(counting),
            pytest.raises(LeaseLostError) as info,
            hold_lease("k", ttl_ms=3_600_000, holder="me") as held,
        ):
            assert Lease.objects.release(held.lease) is True
            thief = Lease.objects.acquire("k", "thief", 3_600_000)
            assert thief is not None and thief.token == 2
        assert (info.value.key, info.value.token) == ("k", 1)
        assert renewals == []
        assert held.lost.is_set()
        # The thief's lease is untouched by our exit.
        assert Lease.objects.current("k") == thief

    def test_lapsed_untaken_before_any_renewal_raises_on_exit(self) -> None:
        with pytest.raises(LeaseLostError) as info, hold_lease("k", ttl_ms=3_600_000, holder="me"):
            lapse("k", ago_ms=1_000)
        assert info.value.token == 1
        row = Lease.objects.get(key="k")
        assert (row.holder, row.token) == ("me", 1)
        assert row.expires_at <= Lease.objects.db_now_ms()

    def test_body_exception_is_kept_when_the_lease_was_lost_too(self) -> None:
        with pytest.raises(ZeroDivisionError) as info, hold_lease("k", ttl_ms=3_600_000, holder="me"):
            lapse("k", ago_ms=1_000)
            Lease.objects.acquire("k", "thief", 60_000)
            1 / 0  # noqa: B018
        if sys.version_info >= (3, 11):
            assert any("was lost while its body ran" in note for note in info.value.__notes__)
        assert Lease.objects.current("k").holder == "thief"

    def test_renewal_thread_closes_its_connection(self) -> None:
        seen: list[Any] = []

        def spy(real: Any, self: LeaseManager, lease: Lease, ttl_ms: int) -> Lease | None:
            seen.append(connections[self.db])
            return real(self, lease, ttl_ms)

        with patch_refresh(spy), hold_lease("k", ttl_ms=300):
            deadline = time.monotonic() + 10
            while not seen and time.monotonic() < deadline:
                time.sleep(0.01)
        assert seen and seen[0] is not connections["default"]
        # The process's keeper renews it, and lets go of its connection once
        # it keeps nothing.
        deadline = time.monotonic() + 10
        while seen[0].connection is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen[0].connection is None

    def test_bad_arguments(self) -> None:
        for kwargs, argument in [
            ({"ttl_ms": 0}, "ttl_ms"),
            ({"ttl_ms": True}, "ttl_ms"),
            ({"holder": ""}, "holder"),
        ]:
            with pytest.raises(ValueError, match=argument), hold_lease("k", **kwargs):
                pass
        with pytest.raises(ValueError, match="key"), hold_lease(""):
            pass
        assert not Lease.objects.exists()

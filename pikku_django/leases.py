"""``hold_lease()``: take a named lease and keep it renewed while a body runs."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager

from django.db import connections
from django.db.models import Q, Value

from pikku_django import validate
from pikku_django.clock import DbNowMs
from pikku_django.conf import conf
from pikku_django.errors import LeaseLostError, LeaseTakenError
from pikku_django.keeper import keeper
from pikku_django.managers.base import write_alias
from pikku_django.models import Lease
from pikku_django.outages import drop_connections

logger = logging.getLogger(__name__)

#: Renewals per lease: renewing every third of the ttl leaves two more tries
#: before the lease runs out when one renewal fails.
RENEWALS_PER_LEASE = 3


def default_holder() -> str:
    """``host:pid:random``, unique to this process and this call."""
    suffix = f":{os.getpid()}:{secrets.token_hex(4)}"
    return socket.gethostname()[: validate.MAX_NAME_LENGTH - len(suffix)] + suffix


class KeepAlive:
    """
    Renews something with a lease (a named lease, a step lease) every third of
    its ttl on a background thread with its own database connection, and says
    when it is lost.

    A renewal that raises proves nothing (the database may be briefly out of
    reach), so it counts as lost only when a renewal answers "not yours", or
    when renewals kept failing until the lease must have run out.
    """

    def __init__(self, name: str, ttl_ms: int, using: str) -> None:
        self.name = name
        self.ttl_ms = ttl_ms
        self.using = using
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._failing = False
        # The lease was granted no earlier than now, so it lasts at least
        # until ``_valid_until`` on the monotonic clock.
        self._valid_until = time.monotonic() + ttl_ms / 1000
        self._thread: threading.Thread | None = None

    @property
    def interval(self) -> float:
        return self.ttl_ms / 1000 / RENEWALS_PER_LEASE

    def renew(self) -> bool:
        """One renewal: True if renewed, False if lost; raising proves nothing."""
        raise NotImplementedError

    def granted(self, sent: float) -> None:
        """The lease was granted by a statement sent at ``sent`` (monotonic): it lasts a ttl from then."""
        self._valid_until = sent + self.ttl_ms / 1000

    def holds(self) -> bool:
        """
        True while the lease is known to be held: not lost, and its last
        renewal (or its grant) answered less than a ttl ago on the monotonic
        clock, which runs on while the process is paused. False proves
        nothing either way: only the database can tell.
        """
        return not self.lost.is_set() and time.monotonic() < self._valid_until

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"pikku-renewal:{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing, waiting for a renewal in flight to finish."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if not self._renew_once():
                    return
        finally:
            # The thread opened its own connection; don't leak it.
            connections[self.using].close()

    def batch_key(self) -> Hashable | None:
        """
        Renewals with the same key are sent together by ``renew_all`` (one
        statement for many leases); None renews this one on its own.
        """
        return None

    @classmethod
    def renew_all(cls, kept: Sequence[KeepAlive]) -> list[bool]:
        """
        One renewal of each of ``kept`` (of one batch key); raising proves
        nothing for any. Renewed together when ``renew_together`` renews them
        all; when it renews fewer, each is asked again on its own to learn
        which was lost.
        """
        if len(kept) > 1 and all(isinstance(item, cls) for item in kept) and cls.renew_together(kept):
            return [True] * len(kept)
        return [item.renew() for item in kept]

    @classmethod
    def renew_together(cls, kept: Sequence[KeepAlive]) -> bool:
        """Renew every one of ``kept`` in one statement; True only if every one was renewed."""
        return False

    def _renew_once(self) -> bool:
        """One renewal; False once the lease is known to be lost."""
        sent = time.monotonic()
        try:
            renewed = self.renew()
        except Exception as error:
            return self._failed(error)
        return self._answered(renewed, sent)

    def _failed(self, error: Exception) -> bool:
        """A renewal raised: it proves nothing, unless the lease must have run out by now."""
        # Logged once per run of failures (an outage), not at every try.
        if not self._failing:
            logger.warning("Renewing %s failed (%r); will retry.", self.name, error)
        self._failing = True
        # The failed connection may be broken: reconnect on the next try.
        drop_connections()
        if time.monotonic() >= self._valid_until:
            logger.error("%s lapsed while renewals kept failing.", self.name)
            self.lost.set()
            return False
        return True

    def _answered(self, renewed: bool, sent: float) -> bool:
        """A renewal sent at ``sent`` answered; False once the lease is lost."""
        if not renewed:
            logger.warning("%s was lost.", self.name)
            self.lost.set()
            return False
        if self._failing:
            logger.warning("Renewing %s works again.", self.name)
            self._failing = False
        self._valid_until = sent + self.ttl_ms / 1000
        return True


class LeaseRenewal(KeepAlive):
    """Keeps one named lease renewed."""

    def __init__(self, lease: Lease, ttl_ms: int, using: str) -> None:
        super().__init__(f"lease {lease.key!r} (token {lease.token})", ttl_ms, using)
        self.lease = lease
        # What a release the body made itself answered (``HeldLease.released``), else None.
        self.released: bool | None = None

    def renew(self) -> bool:
        renewed = Lease.objects.db_manager(self.using).refresh(self.lease, self.ttl_ms)
        if renewed is None:
            return False
        self.lease = renewed
        return True

    def batch_key(self) -> Hashable | None:
        return (LeaseRenewal, self.using, self.ttl_ms)

    @classmethod
    def renew_together(cls, kept: Sequence[KeepAlive]) -> bool:
        """Every lease of ``kept`` (one database and ttl) in one UPDATE, each guarded as ``refresh`` is."""
        renewals = [item for item in kept if isinstance(item, LeaseRenewal)]
        mine = Q()
        for item in renewals:
            mine |= Q(key=item.lease.key, holder=item.lease.holder, token=item.lease.token)
        renewed = (
            Lease.objects.using(renewals[0].using)
            .filter(mine, expires_at__gt=DbNowMs())
            .update(expires_at=DbNowMs() + Value(renewals[0].ttl_ms))
        )
        return renewed == len(renewals)

    def start(self) -> None:
        # The process's keeper renews it: no thread of its own per lease.
        keeper().keep(self)

    def stop(self) -> None:
        keeper().drop(self)


class HeldLease:
    """What the body of ``hold_lease`` sees."""

    def __init__(self, renewal: LeaseRenewal) -> None:
        self._renewal = renewal

    @property
    def lease(self) -> Lease:
        """The lease as last granted or renewed."""
        return self._renewal.lease

    @property
    def key(self) -> str:
        return str(self._renewal.lease.key)

    @property
    def token(self) -> int:
        """The fencing token: pass it along with writes the lease guards."""
        return self._renewal.lease.token

    @property
    def lost(self) -> threading.Event:
        """Set the moment the lease is known to be lost."""
        return self._renewal.lost

    def check(self) -> None:
        """Raise ``LeaseLostError`` if the lease has been lost."""
        if self.lost.is_set():
            raise LeaseLostError(self.key, self.token)

    def stop_renewing(self) -> None:
        """
        Stop renewing, before the body releases the lease itself in a
        transaction of its own (``released``): a renewal racing that release
        would find the lease lapsed and take it for lost.
        """
        self._renewal.stop()

    def hand_over(self) -> None:
        """
        The body hands the lease's release to a transaction that commits
        after it (a lane's next take, ``managers.passes.HeldFinish``): stop
        renewing, and let the exit send no release of its own.
        """
        self._renewal.stop()
        self._renewal.released = True

    def released(self, released: bool) -> None:
        """
        The body released the lease itself, inside the transaction that wrote
        its last work (``LeaseManager.release_within``), and it said
        ``released``. The exit then sends no release of its own and judges
        the lease by this answer, as it judges its own release.
        """
        self._renewal.stop()
        self._renewal.released = released


@contextmanager
def hold_lease(
    key: str, ttl_ms: int | None = None, holder: str | None = None, *, using: str | None = None
) -> Iterator[HeldLease]:
    """
    Hold ``key`` while the body runs, renewing every ttl/3. Raises
    ``LeaseTakenError`` at once if someone else holds it, and
    ``LeaseLostError`` on exit if the lease was lost while the body ran: found
    lost by a renewal, or by the release on exit (which is the last check, so a
    lease lost before any renewal ran is caught too).
    """
    ttl = validate.positive_ms("ttl_ms", conf.LEASE_TTL_MS if ttl_ms is None else ttl_ms)
    holder = default_holder() if holder is None else holder
    alias = write_alias(Lease, using)
    lease = Lease.objects.db_manager(alias).acquire(key, holder, ttl)
    if lease is None:
        raise LeaseTakenError(key)
    with keep_lease(lease, ttl, using=alias) as held:
        yield held


@contextmanager
def keep_lease(lease: Lease, ttl_ms: int, *, using: str) -> Iterator[HeldLease]:
    """
    ``hold_lease`` for a lease already acquired (say, in the transaction that
    took the work it guards): renewed every ttl/3 while the body runs,
    released on exit, ``LeaseLostError`` on exit if it was lost meanwhile.
    """
    key = str(lease.key)
    renewal = LeaseRenewal(lease, ttl_ms, using)
    renewal.start()
    try:
        yield HeldLease(renewal)
    except BaseException as error:
        if not _end(renewal, using):
            # The body's own exception goes on; the loss rides along with it.
            lost = LeaseLostError(key, renewal.lease.token)
            logger.warning("%s (the body raised %r)", lost, error)
            if hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(str(lost))
        raise
    if not _end(renewal, using):
        raise LeaseLostError(key, renewal.lease.token)


def _end(renewal: LeaseRenewal, alias: str) -> bool:
    """
    Stop renewing and release the lease (unless the body released it). True
    if it was held to the end: no renewal found it lost and the release
    found it still ours and live.
    """
    renewal.stop()
    if renewal.lost.is_set():
        return False
    released = renewal.released
    if released is None:
        try:
            released = Lease.objects.db_manager(alias).release(renewal.lease)
        except Exception:
            # Unknown, not lost: it lapses on its own at expires_at.
            logger.warning("Releasing %s failed; it will lapse.", renewal.name, exc_info=True)
            return True
    if not released:
        logger.warning("%s was lost: it had lapsed or passed to another holder by the release.", renewal.name)
        renewal.lost.set()
    return released

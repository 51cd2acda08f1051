"""
The tasks the Tasks benchmarks run: a no-op one on PikkuTaskBackend, one on
django-tasks-db's backend, and one that waits 50 ms.
"""

from __future__ import annotations

import time

from pikku_django.tasks.compat import task


@task()
def noop() -> None:
    return None


@task(backend="tdb")
def noop_tdb() -> None:
    return None


@task()
def sleep_50ms() -> None:
    """A task that waits 50 ms, as one waiting on the network would."""
    time.sleep(0.05)

"""The no-op tasks bench/tasks.py runs: one on PikkuTaskBackend, one on django-tasks-db's backend."""

from __future__ import annotations

from pikku_django.tasks.compat import task


@task()
def noop() -> None:
    return None


@task(backend="tdb")
def noop_tdb() -> None:
    return None

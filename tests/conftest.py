"""
Pytest hooks for the whole suite (helpers the tests import are in tests/support).

The suite runs in parallel (pytest-xdist, ``-n`` in pyproject.toml), each
xdist worker on a test database of its own. The tests marked
``restarts_server`` stop and start the database server itself, which would
pull it from under every other worker: a parallel run leaves them out (and
says so at its end), and they run on their own, serially, with ``-n 0 -m
restarts_server`` (as .ci/run does after each server's parallel run).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

RESTARTS_SERVER = "restarts_server"

# The suite starts a few hundred Python processes (pytest-xdist's workers and
# the workers, sweeps and scripts the tests run), each importing the project:
# from the bytecode cache, not compiled again each time, even where the
# environment says PYTHONDONTWRITEBYTECODE. Set here, before xdist starts its
# workers, so that they and every process they start inherit it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: a serial run runs them
        return
    left = [item for item in items if item.get_closest_marker(RESTARTS_SERVER)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not item.get_closest_marker(RESTARTS_SERVER)]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    from django.db import connection

    parallel = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if parallel and connection.vendor != "sqlite":
        terminalreporter.write_line(
            f"The tests marked {RESTARTS_SERVER} stop the database server, so a parallel run leaves "
            f"them out; on PostgreSQL or MariaDB run them alone: ... -m pytest -n 0 -m {RESTARTS_SERVER}"
        )


@pytest.fixture(autouse=True, scope="session")
def _quick_password_hashes() -> Iterator[None]:
    """
    The admin tests' users get a password hashed in microseconds, not Django's
    default PBKDF2 (about 0.4 s each), as Django's docs advise for test runs.
    """
    from django.test.utils import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(autouse=True)
def _stop_result_hubs() -> Iterator[None]:
    """A reader's LISTEN connection (PostgreSQL) ends with its test, before the test database goes."""
    yield
    from pikku_django.workflows.hearing import stop_hubs

    stop_hubs()

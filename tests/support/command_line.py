"""
``manage.py`` argument parsing through Django's command-line entry point,
in the test process: the exit code, stdout and stderr a process would give,
without a process start-up (most of a second of CPU) for each bad option.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

from django.core.management import ManagementUtility
from django.core.management.base import BaseCommand


def from_the_command_line(*argv: str) -> tuple[int, str, str]:
    """
    ``manage.py argv…`` as the command line runs it, for options that must
    be refused: (exit code, stdout, stderr). Should they be accepted after
    all, the command is not run here (no worker or sweep loop in the test
    process): the exit code is then 0.
    """
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with redirect_stdout(out), redirect_stderr(err), mock.patch.object(BaseCommand, "execute"):
        try:
            ManagementUtility(["manage.py", *argv]).execute()
        except SystemExit as exit_:
            code = exit_.code
    assert isinstance(code, int), code
    return code, out.getvalue(), err.getvalue()

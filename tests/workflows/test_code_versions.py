"""
Every run stores the code version it was started under (``code_version``)
and the last pass's (``driven_version``): PIKKU_CODE_VERSION, or a hash of
its workflow's source that every process computes alike.
"""

from __future__ import annotations

import subprocess
import sys

from django.test import TransactionTestCase, override_settings

from pikku_django.managers.versions import HASH_CHARS, code_version
from pikku_django.models import WorkflowRun
from pikku_django.workflows import run_workflow, start_workflow
from tests.support.children import ROOT, subprocess_env

PRINT_VERSION = """
import django, sys
django.setup()
from pikku_django.models import WorkflowRun
from pikku_django.managers.versions import code_version
print(code_version(sys.argv[1]))
"""


class CodeVersionTests(TransactionTestCase):
    def test_by_default_a_hash_of_the_workflow_s_source_on_every_run(self) -> None:
        run = start_workflow("test.steps", {"steps": 1}, inline=True)
        assert run.status == "completed"
        run.refresh_from_db()
        assert run.code_version == run.driven_version == code_version("test.steps")
        assert len(run.code_version) == HASH_CHARS and int(run.code_version, 16) >= 0
        assert code_version("test.steps") != code_version("test.sleeper")
        # Children and the items of a map carry one too.
        parent = start_workflow("test.parent", {"child": "test.double", "child_input": 2}, inline=True)
        child = WorkflowRun.objects.get(parent=parent)
        assert child.code_version == code_version(child.workflow) != ""

    def test_another_process_computes_the_same_version(self) -> None:
        done = subprocess.run(
            [sys.executable, "-c", PRINT_VERSION, "test.deploy.tax"],
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == code_version("test.deploy.tax")

    def test_the_setting_names_the_version_and_a_pass_under_another_stamps_driven_version(self) -> None:
        with override_settings(PIKKU_CODE_VERSION="release-1"):
            run = run_workflow(start_workflow("test.sleeper", {"ms": 60_000}).pk)
        assert (run.code_version, run.driven_version) == ("release-1", "release-1")
        WorkflowRun.objects.filter(pk=run.pk).update(wake_at=0)
        with override_settings(PIKKU_CODE_VERSION="release-2"):
            run = run_workflow(run.pk)
        assert (run.code_version, run.driven_version) == ("release-1", "release-2")

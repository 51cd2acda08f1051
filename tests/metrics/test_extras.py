"""
Without the ``metrics`` and ``otel`` extras nothing of them is imported:
every other module loads, ``pikku_django.urls`` serves nothing, and runs
start and end; with the API but no SDK configured, no trace context is stored.
"""

from __future__ import annotations

import subprocess
import sys

from django.test import TransactionTestCase

from pikku_django.models import WorkflowRun
from tests.support.children import ROOT, subprocess_env

#: Runs in a child with the extras' packages made unimportable.
WITHOUT_EXTRAS = """
import importlib, pkgutil, sys
for name in ("prometheus_client", "opentelemetry"):
    sys.modules[name] = None  # import raises ImportError, as when not installed
import django
django.setup()
import pikku_django
skipped = {"pikku_django.metrics", "pikku_django.otel"}
for module in pkgutil.walk_packages(pikku_django.__path__, "pikku_django."):
    if module.name not in skipped:
        importlib.import_module(module.name)
from pikku_django import urls
from pikku_django.workflows import start_workflow, tracing
assert urls.urlpatterns == [], urls.urlpatterns
assert tracing.otel is None
run = start_workflow("test.steps", {"steps": 1}, inline=True)
assert run.status == "completed", run.status
loaded = [name for name, module in sys.modules.items() if module is not None
          and name.split(".")[0] in ("prometheus_client", "opentelemetry")]
assert not loaded, loaded
print(run.pk)
"""

#: Runs in a child with the otel extra but no SDK: the API's no-op tracer.
NO_SDK = """
import django
django.setup()
from pikku_django.workflows import start_workflow
print(start_workflow("test.steps", {"steps": 1}, inline=True).pk)
"""


def child(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class ExtrasTests(TransactionTestCase):
    def test_nothing_of_the_extras_is_imported_without_them(self) -> None:
        run = WorkflowRun.objects.get(pk=child(WITHOUT_EXTRAS))
        assert run.status == "completed" and run.trace_context is None

    def test_the_api_without_an_sdk_stores_no_trace_context(self) -> None:
        run = WorkflowRun.objects.get(pk=child(NO_SDK))
        assert run.status == "completed" and run.trace_context is None

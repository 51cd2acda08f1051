"""
Where tasks may live, and when their modules are imported, in projects of
their own (each a fresh process): the backend imports no model while apps
load, so an app that imports its ``@task`` functions from its package or its
``AppConfig`` loads, and ``check`` without ``pikku_django`` installed reports
it; a stored task path may import a module of an installed app, of the
settings module's package, or of ``PIKKU_TASK_MODULES``, and nothing else.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import django
from django.test import SimpleTestCase, override_settings

from pikku_django.checks import TASK_MODULE_MISSING_CHECK_ID, TASK_MODULES_CHECK_ID, check_task_modules
from pikku_django.tasks.backend import RESULT_TIMEOUT_MS
from pikku_django.workflows.results import DEFAULT_RESULT_TIMEOUT_MS
from tests.support.children import ROOT

#: A task module of a project: what it imports is the public face alone.
JOBS = """
from pikku_django.tasks.compat import task


@task()
def ping() -> str:
    return "pong"
"""

#: Django 5.2 runs a backend's check() through the backport's app.
FRAMEWORK_APPS = [] if django.VERSION >= (6, 0) else ["django_tasks"]


def write_project(root: Path, settings: str, files: dict[str, str]) -> None:
    """A project under ``root``: ``files`` by path, and the settings module's body appended to a base."""
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(root / "db.sqlite3")}
    base = f"""
        SECRET_KEY = "x"
        USE_TZ = True
        DATABASES = {{"default": {database!r}}}
        TASKS = {{"default": {{"BACKEND": "pikku_django.tasks.PikkuTaskBackend"}}}}
    """
    files = {**files, settings: textwrap.dedent(base) + textwrap.dedent(files.get(settings, ""))}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text))


def run(root: Path, settings_module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python *args`` in the project, with its settings and the checkout importable."""
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": settings_module,
        "PYTHONPATH": f"{root}:{ROOT}",
        "HOME": str(root),
    }
    return subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=60
    )


SETUP_AND_NAME = "import django; django.setup(); from loading_app.jobs import ping; print(ping.module_path)"


class LoadingTests(SimpleTestCase):
    def test_an_app_that_imports_its_tasks_from_its_package_loads(self) -> None:
        root = Path(self.enterContext(_tmp()))
        write_project(
            root,
            "loading_settings.py",
            {
                "loading_settings.py": 'INSTALLED_APPS = ["pikku_django", "loading_app"]',
                "loading_app/__init__.py": "from loading_app import jobs  # noqa: F401",
                "loading_app/jobs.py": JOBS,
            },
        )
        done = run(root, "loading_settings", "-c", SETUP_AND_NAME)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "loading_app.jobs.ping"
        checked = run(root, "loading_settings", "-m", "django", "check")
        assert checked.returncode == 0, checked.stderr
        assert "no issues" in checked.stdout

    def test_an_app_config_that_imports_its_tasks_loads(self) -> None:
        root = Path(self.enterContext(_tmp()))
        write_project(
            root,
            "loading_settings.py",
            {
                "loading_settings.py": 'INSTALLED_APPS = ["pikku_django", "loading_app.apps.LoadingConfig"]',
                "loading_app/__init__.py": "",
                "loading_app/apps.py": """
                    from django.apps import AppConfig

                    from loading_app import jobs  # noqa: F401


                    class LoadingConfig(AppConfig):
                        name = "loading_app"
                """,
                "loading_app/jobs.py": JOBS,
            },
        )
        done = run(root, "loading_settings", "-c", SETUP_AND_NAME)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "loading_app.jobs.ping"

    def test_the_backends_wait_has_the_results_default_timeout(self) -> None:
        # Written out in the backend, which cannot import the results module.
        assert RESULT_TIMEOUT_MS == DEFAULT_RESULT_TIMEOUT_MS

    def test_check_without_pikku_django_installed_reports_it_with_its_hint(self) -> None:
        root = Path(self.enterContext(_tmp()))
        write_project(
            root, "loading_settings.py", {"loading_settings.py": f"INSTALLED_APPS = {FRAMEWORK_APPS!r}"}
        )
        done = run(root, "loading_settings", "-m", "django", "check")
        assert "Traceback" not in done.stderr, done.stderr
        if django.VERSION >= (6, 0):
            # Django 6 runs the Tasks backends' checks once django.tasks is
            # imported, which this project (no task of its own) never does.
            assert done.returncode == 0, done.stderr
            return
        assert done.returncode == 1, done.stderr
        assert "pikku_django.E020" in done.stderr, done.stderr
        assert "HINT: Add 'pikku_django' to INSTALLED_APPS" in done.stderr, done.stderr


#: Resolves each path given, in a fresh process: its module, or the refusal.
RESOLVE = """
import sys
import django
django.setup()
from pikku_django.errors import TaskPathError
from pikku_django.tasks.results import resolve_task
for path in sys.argv[1:]:
    try:
        print(path, "->", resolve_task(path).module_path)
    except TaskPathError as e:
        print(path, "refused:", e)
"""


class TaskModuleTests(SimpleTestCase):
    def project(self) -> Path:
        """A project whose own package (where settings.py lives) is no installed app, and a module beside."""
        root = Path(self.enterContext(_tmp()))
        write_project(
            root,
            "mysite/settings.py",
            {
                "mysite/__init__.py": "",
                "mysite/settings.py": """
                    INSTALLED_APPS = ["pikku_django"]
                    PIKKU_TASK_MODULES = ["listed"]
                """,
                "mysite/tasks.py": JOBS,
                "listed/__init__.py": "",
                "listed/jobs.py": JOBS,
                "elsewhere/__init__.py": "",
                "elsewhere/jobs.py": JOBS,
            },
        )
        return root

    def test_the_settings_package_and_the_listed_modules_are_imported_nothing_else(self) -> None:
        root = self.project()
        paths = ["mysite.tasks.ping", "listed.jobs.ping", "elsewhere.jobs.ping"]
        done = run(root, "mysite.settings", "-c", RESOLVE, *paths)
        assert done.returncode == 0, done.stderr
        own, listed, elsewhere = done.stdout.splitlines()
        assert own == "mysite.tasks.ping -> mysite.tasks.ping"
        assert listed == "listed.jobs.ping -> listed.jobs.ping"
        # Never imported: the refusal says where tasks may live.
        assert elsewhere.startswith("elsewhere.jobs.ping refused:"), elsewhere
        assert "installed app" in elsewhere and "settings module's package" in elsewhere, elsewhere
        assert "PIKKU_TASK_MODULES" in elsewhere, elsewhere

    def test_check_warns_of_a_listed_module_that_cannot_be_imported(self) -> None:
        root = self.project()
        settings = root / "mysite" / "settings.py"
        settings.write_text(settings.read_text() + 'PIKKU_TASK_MODULES = ["listed", "lisetd.jobs"]\n')
        done = run(root, "mysite.settings", "-m", "django", "check")
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert TASK_MODULE_MISSING_CHECK_ID in done.stderr and "'lisetd.jobs'" in done.stderr, done.stderr
        assert "'listed'" not in done.stderr, done.stderr


class TaskModulesCheckTests(SimpleTestCase):
    def test_anything_but_a_list_of_dotted_names_is_an_error(self) -> None:
        for value in ["mysite.jobs", ["mysite jobs"], [3], {"mysite": 1}, ["mysite..jobs"]]:
            with override_settings(PIKKU_TASK_MODULES=value):
                (message,) = check_task_modules()
            assert message.id == TASK_MODULES_CHECK_ID and message.is_serious(), value
            assert "PIKKU_TASK_MODULES" in message.msg and message.hint
        with override_settings(PIKKU_TASK_MODULES=["testproject.testing.tasks", "testproject"]):
            assert check_task_modules() == []


def _tmp() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="pikku-tasks-")

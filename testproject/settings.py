"""Settings for the demo and the test suite: the database comes from DATABASE_URL."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

SECRET_KEY = "pikku-django-testproject-not-secret"
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
# PIKKU_USE_TZ=0 and PIKKU_TIME_ZONE: the settings matrix .ci/run also runs
# (USE_TZ = False, in a zone with DST, as older projects have it).
USE_TZ = env.bool("PIKKU_USE_TZ", default=True)
TIME_ZONE = env.str("PIKKU_TIME_ZONE", default="UTC")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pikku_django",
    "testproject.demo",
    "testproject.testing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# The default is a SQLite *file*, so that several processes share it. The
# test database is a file too (TEST.NAME), for the multi-process tests.
DATABASES = {
    "default": env.db_url_config(
        env.str("DATABASE_URL", default="") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    ),
}
_db = DATABASES["default"]
# PIKKU_TEST_DB names the test database (a file path on SQLite), so that
# several test runs can share one server without trampling each other.
_test_db = env.str("PIKKU_TEST_DB", default="")
if _test_db:
    _db.setdefault("TEST", {})["NAME"] = _test_db
if _db["ENGINE"].endswith("sqlite3"):
    _db.setdefault("TEST", {}).setdefault("NAME", str(BASE_DIR / "test-db.sqlite3"))
# PIKKU_SQLITE_DJANGO_DEFAULTS=1 leaves SQLite on Django's own defaults
# (DEFERRED transactions, a 5 s timeout), as a project that never tuned them
# has it: the tests that prove the app needs none of the settings below.
if _db["ENGINE"].endswith("sqlite3") and not env.bool("PIKKU_SQLITE_DJANGO_DEFAULTS", default=False):
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write
    # lock at BEGIN so two transactions never deadlock upgrading to it.
    _db.setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
elif _db["ENGINE"].endswith("mysql"):
    _db.setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")
    _db.setdefault("TEST", {}).update({"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"})
# PIKKU_ISOLATION_LEVEL (e.g. "serializable") runs the server's transactions
# at that isolation level, as a project that sets it has them (the tests of
# serialization failures start their workers so).
_isolation = env.str("PIKKU_ISOLATION_LEVEL", default="").strip().lower().replace("_", " ")
if _isolation and _db["ENGINE"].endswith("postgresql"):
    import psycopg

    _db.setdefault("OPTIONS", {})["isolation_level"] = psycopg.IsolationLevel[
        _isolation.upper().replace(" ", "_")
    ]
elif _isolation and _db["ENGINE"].endswith("mysql"):
    _db.setdefault("OPTIONS", {})["isolation_level"] = _isolation
# PIKKU_BEHIND_POOLER=1: a project behind a transaction-mode pooler, as
# Django asks it to be configured (no server-side cursors).
if env.bool("PIKKU_BEHIND_POOLER", default=False):
    _db["DISABLE_SERVER_SIDE_CURSORS"] = True
# A subprocess of the test suite is pointed at the live test database by name.
if env.str("PIKKU_TEST_DB_NAME", default=""):
    _db["NAME"] = env.str("PIKKU_TEST_DB_NAME")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"


# Worker processes started by the tests take short leases from the environment.
# (PIKKU_TAKE_AHEAD_BELOW_MS too: a test that needs runs taken ahead on a busy machine.)
for _name in ("PIKKU_LEASE_TTL_MS", "PIKKU_STEP_LEASE_MS", "PIKKU_TAKE_AHEAD_BELOW_MS"):
    if env.str(_name, default=""):
        globals()[_name] = env.int(_name)


# Django Tasks on pikku_django, where a Tasks framework is installed
# (django.tasks on Django 6; on 5.2 the django-tasks backport, the "tasks"
# extra): "default" runs each task once, "retrying" retries twice.
if importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks"):
    TASKS = {
        "default": {
            "BACKEND": "pikku_django.tasks.PikkuTaskBackend",
            "QUEUES": ["default", "a", "b", "slow"],
        },
        "retrying": {
            "BACKEND": "pikku_django.tasks.PikkuTaskBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"retries": 2},
        },
        "no_losses": {
            "BACKEND": "pikku_django.tasks.PikkuTaskBackend",
            "QUEUES": ["default", "slow"],
            "OPTIONS": {"retries": 1, "worker_losses": 0},
        },
    }

# The default task backend's OPTIONS, as JSON from the environment (for the
# tests that run ``manage.py check`` on bad ones).
if env.str("PIKKU_TASK_OPTIONS", default="") and "TASKS" in globals():
    TASKS["default"]["OPTIONS"] = json.loads(env.str("PIKKU_TASK_OPTIONS"))  # type: ignore[index]

# Per-queue concurrency, as JSON from the environment for worker processes.
if env.str("PIKKU_QUEUES", default=""):
    PIKKU_QUEUES = json.loads(env.str("PIKKU_QUEUES"))

# Safe deploys: the code version and what a history that no longer fits does,
# from the environment for the worker processes the tests start.
for _name in ("PIKKU_CODE_VERSION", "PIKKU_ON_REPLAY_MISMATCH"):
    if env.str(_name, default=""):
        globals()[_name] = env.str(_name)

# Schedules, as JSON from the environment for the scheduler processes the tests start.
if env.str("PIKKU_SCHEDULES", default=""):
    PIKKU_SCHEDULES = json.loads(env.str("PIKKU_SCHEDULES"))

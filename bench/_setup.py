"""
What every benchmark does first: put the repo root on ``sys.path`` and set
Django up (``testproject.settings`` unless DJANGO_SETTINGS_MODULE says
otherwise); and what they all record: the checkout measured, and a migrated
database.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.migrations.executor import MigrationExecutor  # noqa: E402


def revision() -> str:
    """The checkout measured: git describe, plus a digest of pikku_django/ when it is dirty."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],  # noqa: S607
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return f"{ROOT} (not a git checkout)"
    text = f"git {done.stdout.strip()}"
    if text.endswith("-dirty"):
        digest = hashlib.sha256()
        for path in sorted((ROOT / "pikku_django").rglob("*.py")):
            digest.update(path.read_bytes())
        text += f" (pikku_django/*.py sha256 {digest.hexdigest()[:12]})"
    return text


def migrate_if_needed() -> bool:
    """Migrate the database if it needs it; says whether it did."""
    executor = MigrationExecutor(connection)
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        call_command("migrate", interactive=False, verbosity=0)
        return True
    return False

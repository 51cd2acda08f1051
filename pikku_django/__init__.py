"""Durable leases and workflow steps for Django, judged on the database's clock."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pikku-django")
except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
    __version__ = "0.0.0"

from __future__ import annotations

from django.apps import AppConfig


class TestingConfig(AppConfig):
    """Workflows and tables the test suite drives through real worker processes."""

    name = "testproject.testing"
    label = "testing"
    default_auto_field = "django.db.models.BigAutoField"

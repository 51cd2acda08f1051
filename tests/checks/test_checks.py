"""System checks on the PIKKU_* settings."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import SimpleTestCase, override_settings

from pikku_django.checks import SETTING_CHECK_IDS, check_settings
from pikku_django.conf import DEFAULTS, conf


class SettingsCheckTests(SimpleTestCase):
    # call_command("check") runs the database checks too (Django 6 asks SQLite
    # about JSON support), so the test may touch the database.
    databases = {"default"}

    def test_defaults_pass(self) -> None:
        assert check_settings() == []

    def test_each_setting_is_type_checked(self) -> None:
        for name, check_id in SETTING_CHECK_IDS.items():
            for bad in ["30", 1.5, True, None, -1]:
                with override_settings(**{name: bad}):
                    errors = check_settings()
                assert [e.id for e in errors] == [check_id], (name, bad)
                assert name in errors[0].msg and errors[0].hint

    def test_zero(self) -> None:
        with override_settings(PIKKU_STEP_RETRIES=0):
            assert check_settings() == []
        with override_settings(PIKKU_LEASE_TTL_MS=0):
            assert [e.id for e in check_settings()] == ["pikku_django.E001"]

    def test_call_command_check_fails(self) -> None:
        with override_settings(PIKKU_LEASE_TTL_MS="soon"), pytest.raises(SystemCheckError, match="E001"):
            call_command("check")

    def test_settings_are_read_lazily(self) -> None:
        assert DEFAULTS["PIKKU_LEASE_TTL_MS"] == conf.LEASE_TTL_MS
        with override_settings(PIKKU_LEASE_TTL_MS=1234, PIKKU_STEP_RETRIES=0):
            assert conf.LEASE_TTL_MS == 1234
            assert conf.STEP_RETRIES == 0

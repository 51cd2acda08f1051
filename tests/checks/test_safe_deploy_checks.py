"""The checks of the safe-deploy settings: PIKKU_ON_REPLAY_MISMATCH and PIKKU_CODE_VERSION."""

from __future__ import annotations

from django.test import SimpleTestCase, override_settings

from pikku_django.checks import CODE_VERSION_CHECK_ID, REPLAY_MISMATCH_CHECK_ID, check_safe_deploys
from pikku_django.conf import conf


class SafeDeployChecksTests(SimpleTestCase):
    def test_defaults_pass(self) -> None:
        assert check_safe_deploys() == []
        assert conf.ON_REPLAY_MISMATCH == "fail" and conf.CODE_VERSION is None

    def test_good_values_pass(self) -> None:
        with override_settings(PIKKU_ON_REPLAY_MISMATCH="park", PIKKU_CODE_VERSION="a" * 255):
            assert check_safe_deploys() == []
            assert conf.ON_REPLAY_MISMATCH == "park" and conf.CODE_VERSION == "a" * 255

    def test_bad_values_are_errors_naming_the_setting(self) -> None:
        for bad in ("retry", None, 1):
            with override_settings(PIKKU_ON_REPLAY_MISMATCH=bad):
                errors = check_safe_deploys()
            assert [e.id for e in errors] == [REPLAY_MISMATCH_CHECK_ID]
            assert "PIKKU_ON_REPLAY_MISMATCH" in errors[0].msg and errors[0].hint
        for bad in ("", "x" * 256, 7):
            with override_settings(PIKKU_CODE_VERSION=bad):
                errors = check_safe_deploys()
            assert [e.id for e in errors] == [CODE_VERSION_CHECK_ID]
            assert "PIKKU_CODE_VERSION" in errors[0].msg

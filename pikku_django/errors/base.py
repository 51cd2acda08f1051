"""The base of every error the app raises, and the two kinds every part shares."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class PikkuError(Exception):
    """Base class of every error pikku_django raises."""


class InvalidArgumentError(PikkuError, ValueError):
    """An argument was refused before any SQL ran; the message names it."""


class PikkuConfigurationError(PikkuError, ImproperlyConfigured):
    """A PIKKU_* setting is missing or of the wrong type."""

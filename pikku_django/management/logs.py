"""Where the long-running commands send the app's log: their own stderr."""

from __future__ import annotations

import logging
from typing import Any

#: What a worker tells at its default verbosity (run ends, failed attempts
#: and retries, lost workers), at INFO: ``workflows.activity``.
ACTIVITY_LOGGER = "pikku_django.activity"


def configure_logging(stream: Any, verbosity: int) -> None:
    """
    Send the ``pikku_django`` loggers to ``stream`` (a command's stderr).
    Verbosity 0: errors only; 1: warnings, and each run's end, failed
    attempt and lost worker (``pikku_django.activity``); 2: info (each
    pass); 3: debug.
    """
    level = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}.get(verbosity, logging.DEBUG)
    logger = logging.getLogger("pikku_django")
    logger.setLevel(level)
    logging.getLogger(ACTIVITY_LOGGER).setLevel(min(level, logging.INFO) if verbosity else level)
    if not any(getattr(h, "_pikku_command", False) for h in logger.handlers):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._pikku_command = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False

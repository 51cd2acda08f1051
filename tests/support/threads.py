"""A thread that runs a test's body on a connection of its own, closed when the body ends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def in_thread(name: str, target: Callable[[], Any]) -> threading.Thread:
    """Start ``target`` in a daemon thread named ``name``; its connections are closed when it ends."""

    def body() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread

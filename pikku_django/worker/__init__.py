"""
The worker process (``pikku_worker`` is a thin shell over ``Worker``): its
lanes, the takes and the due look, its name, the watchers and listener that
wake it, the loops beside the lanes, and the ``Poller`` every loop is.
Nothing below this package imports it.
"""

from __future__ import annotations

from pikku_django.worker.lane import Lane
from pikku_django.worker.poller import Poller, refresh_connections
from pikku_django.worker.process import Worker

__all__ = ["Lane", "Poller", "Worker", "refresh_connections"]

"""
The code version a run is started and driven under (``WorkflowRun.code_version``,
``driven_version``): ``PIKKU_CODE_VERSION``, or by default a hash of the
source of the run's workflow (its function and the module that defines it),
so the same code gives the same version in every process, whatever other
workflows a process has loaded.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any

from pikku_django.conf import conf

#: Each workflow's function by name, noted by ``@workflow`` (``workflows.registry``).
_functions: dict[str, Callable[..., Any]] = {}

#: The length of a default version: a prefix of the SHA-256 of the source.
HASH_CHARS = 16


def note_workflow(name: str, fn: Callable[..., Any]) -> None:
    """``@workflow(name)`` registered ``fn``: its version is a hash of its source."""
    _functions[name] = fn


def code_version(workflow: str) -> str:
    """The version a run of ``workflow`` is stamped with by this process."""
    configured = conf.CODE_VERSION
    if configured is not None:
        return configured
    fn = _functions.get(workflow)
    return "" if fn is None else source_hash(fn)


@functools.lru_cache(maxsize=1024)
def source_hash(fn: Callable[..., Any]) -> str:
    """A hash of ``fn``'s source and of its module's; its dotted name where no source can be read."""
    digest = hashlib.sha256(f"{fn.__module__}.{fn.__qualname__}".encode())
    try:
        digest.update(inspect.getsource(fn).encode())
        module = inspect.getmodule(fn)
        if module is not None:
            digest.update(inspect.getsource(module).encode())
    except (OSError, TypeError):
        pass
    return digest.hexdigest()[:HASH_CHARS]

"""A user script's default collective timeout: the job's ``collective_timeout``
(``TORCHJOB_COLLECTIVE_TIMEOUT``, else ``COLLECTIVE_TIMEOUT_S``) for every process group it makes
without a ``timeout=`` of its own, instead of torch's (gloo 30 min, NCCL 10 min).

Lazy: torch is not imported here. ``install`` sets the default when the script imports
``torch.distributed.distributed_c10d``, whose ``_get_default_timeout`` reads the module's
``default_pg_timeout`` and ``default_pg_nccl_timeout`` (as torch 2.13 does).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from torchjob.trainer.contract import (COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S, EXIT_CONFIG,
                                       seconds_from)

C10D = "torch.distributed.distributed_c10d"


def seconds(environ: Mapping[str, str]) -> float:
    """The job's collective timeout in ``environ``; a ValueError that names the variable."""
    return seconds_from(environ, COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S)


def apply(c10d: types.ModuleType, timeout: timedelta) -> None:
    """``timeout`` as the default of every process group ``c10d`` makes (NCCL's only where
    torch has NCCL: without it torch falls back to ``default_pg_timeout``)."""
    setattr(c10d, "default_pg_timeout", timeout)
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        setattr(c10d, "default_pg_nccl_timeout", timeout)


class _Loader(importlib.abc.Loader):
    """The real loader of ``C10D``, then ``apply``; anything else asked of it is the real one's."""

    def __init__(self, loader: Any, timeout: timedelta) -> None:
        self._loader, self._timeout = loader, timeout

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        apply(module, self._timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``C10D`` through the other finders, once, and hands it to ``_Loader``."""

    def __init__(self, timeout: timedelta) -> None:
        self._timeout = timeout

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != C10D:
            return None
        for finder in sys.meta_path:
            found = None if finder is self else finder.find_spec(name, path, target)
            if found is not None and found.loader is not None:
                found.loader = _Loader(found.loader, self._timeout)
                return found
        return None


def install(environ: Mapping[str, str] = os.environ) -> None:
    """Make the job's collective timeout the default, now or when torch's c10d is imported;
    exit 2 (``EXIT_CONFIG``) when the variable holds no number of seconds."""
    try:
        timeout = timedelta(seconds=seconds(environ))
    except ValueError as exc:
        print(f"torchjob: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    if C10D in sys.modules:
        apply(sys.modules[C10D], timeout)
    else:
        sys.meta_path.insert(0, _Finder(timeout))

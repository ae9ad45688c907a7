"""A user script's default collective timeout: the job's ``collective_timeout``
(``TORCHJOB_COLLECTIVE_TIMEOUT``, else ``COLLECTIVE_TIMEOUT_S``) for every process group it makes
without a ``timeout=`` of its own, instead of torch's (gloo 30 min, NCCL 10 min).

Lazy: torch is not imported here. ``install`` sets the default when the script imports
``torch.distributed.distributed_c10d``, whose ``_get_default_timeout`` reads the module's
``default_pg_timeout`` and ``default_pg_nccl_timeout`` (as torch 2.13 does).
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Mapping
from datetime import timedelta

from torchjob.trainer import frames
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


def install(environ: Mapping[str, str] = os.environ) -> None:
    """Make the job's collective timeout the default, now or when torch's c10d is imported;
    exit 2 (``EXIT_CONFIG``) when the variable holds no number of seconds."""
    try:
        timeout = timedelta(seconds=seconds(environ))
    except ValueError as exc:
        print(f"torchjob: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    frames.after_import(C10D, lambda c10d: apply(c10d, timeout))

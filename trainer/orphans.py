"""No orphans: each worker asks the kernel for SIGKILL when its parent goes (Linux
``PR_SET_PDEATHSIG``), so that a killed agent leaves no worker holding its GPU and its peers;
the other nodes see a lost peer instead. Why torchrun needs this: docs/internals.md.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends; exit now if it already has.
    Does nothing off Linux."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + int(signal.SIGKILL))

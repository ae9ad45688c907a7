"""No orphans: a worker dies with the process that started it.

torchrun starts each worker in a session of its own, so a SIGKILL of the agent (an OOM kill, a
node agent killed by hand, a container runtime that only kills PID 1) left its workers running,
holding their GPUs and their peers in a collective until the process-group timeout. Each worker
asks the kernel for SIGKILL when its parent goes (Linux ``PR_SET_PDEATHSIG``): a user script's
parent is the agent; the built-in trainer's is the fork server, which asks the same for itself
as it starts (torchjob.trainer.forkserver_guard). The other nodes then see a lost peer and restart
without this one, as for a lost node.
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

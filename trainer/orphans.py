"""No orphans: each worker asks the kernel for SIGKILL when its parent goes (Linux
``PR_SET_PDEATHSIG``), so that a killed agent leaves no worker holding its GPU and its peers;
the other nodes see a lost peer instead; and an agent whose launcher is gone stops its job
(``stop_when_orphaned``). Why torchrun needs this: docs/internals.md.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

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


def stop_when_orphaned(interval: float = 0.5) -> None:
    """Stop this agent as a stop signal does (its workers checkpoint and exit 143) once its
    parent, the launcher that follows it, is gone: a ``torchjob run`` killed outright (kill
    -9, a CI runner's timeout) left its nodes, each in a session of its own, training on with
    no one to stop them. Its standard output and error go to /dev/null first: they are the
    launcher's pipes, and a write to them would fail in the middle of the stop."""
    parent = os.getppid()
    if parent <= 1:  # a container's first process, or already orphaned: nothing to watch
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        output_to_devnull()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="torchjob-orphan-watch", daemon=True).start()


def output_to_devnull() -> None:
    """Standard output and error (the file descriptors, whatever holds them) to /dev/null,
    where whoever read them is gone (a launcher killed, a terminal closed): each write would
    fail (EPIPE, EIO) in the middle of a stop."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)

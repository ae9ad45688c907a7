"""A stop told to the agent is acted on even when the exception its handler raised was lost:
torch's handler raises ``SignalException`` wherever the main thread is, and raised inside a
finalizer (Python prints "Exception ignored") or into a broad ``except Exception`` it was lost
(a stop as the first worker was forked: the job trained to its end). The handlers note the
signal first; the agent raises it again at its next look (``raise_if_heard``). Why:
docs/internals.md.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any, Callable

AGENT_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # torch's
_heard: list[int] = []


def remember() -> None:
    """Wrap the handler each of ``AGENT_STOPS`` has now (torch installs its own as it starts
    the workers), once, so that the signal is noted before the handler raises."""
    for sig in AGENT_STOPS:
        handler = signal.getsignal(sig)
        if callable(handler) and not getattr(handler, "notes_the_stop", False):
            signal.signal(sig, _noting(handler))


def _noting(handler: Callable[[int, FrameType | None], Any]) -> Callable[..., Any]:
    def noted(signum: int, frame: FrameType | None) -> Any:
        if not _heard:
            _heard.append(signum)
        return handler(signum, frame)

    noted.notes_the_stop = True  # type: ignore[attr-defined]
    return noted


def raise_if_heard() -> None:
    """Raise what torch's handler raises for a stop heard before: the agent stops its workers
    and exits 128 + the signal, as for one whose exception was not lost."""
    if _heard:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        sig = signal.Signals(_heard[0])
        raise SignalException(f"Process {os.getpid()} got signal: {sig}", sigval=sig)

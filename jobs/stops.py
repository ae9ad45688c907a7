"""Counting the stop signals a torchjob command gets (Ctrl-C, SIGTERM) instead of dying of
them: the first stops the job, a second stops it more firmly (kills it, or stops waiting)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from torchjob.trainer.contract import COMMAND_STOP_SIGNALS


class Stops:
    """The stop signals counted so far."""

    def __init__(self) -> None:
        self.count = 0

    def _got(self, signum: int, frame: Any) -> None:
        self.count += 1


@contextlib.contextmanager
def stop_signals() -> Iterator[Stops]:
    """Count Ctrl-C and SIGTERM during the block; the handlers from before are back after it.
    Only the main thread can set handlers: elsewhere nothing is counted."""
    stops = Stops()
    before = {}
    if threading.current_thread() is threading.main_thread():
        before = {s: signal.signal(s, stops._got) for s in COMMAND_STOP_SIGNALS}
    try:
        yield stops
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)

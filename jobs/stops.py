"""Counting the stop signals a torchjob command gets (Ctrl-C, SIGTERM) instead of dying of
them: the first stops the job, a second stops it more firmly (kills it, or stops waiting);
a second within ``SAME_STOP_S`` of the first is the same stop passed on again. A hang-up
(SIGHUP) is a stop too; a job that outlives the command (a cluster's) is left running."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from torchjob.trainer.contract import COMMAND_STOP_SIGNALS
from torchjob.trainer.orphans import output_to_devnull


# A stop signal this soon after the one counted before is the same stop: a wrapper that
# passes signals on (timeout, a shell's trap) gets the terminal's Ctrl-C with the command and
# sends it again at once, so one Ctrl-C arrived twice and killed the job without its
# checkpoint. Short: a handler runs when the main thread next looks (up to STOP_POLL_S late),
# and a person's second Ctrl-C, after reading what the first did, must count.
SAME_STOP_S = 0.25


class Stops:
    """The stop signals counted so far (one per ``SAME_STOP_S``), and whether the terminal
    hung up (SIGHUP: an ssh session dropped, a terminal closed)."""

    def __init__(self) -> None:
        self.count = 0
        self.hung_up = False
        self._last: float | None = None  # when the last one counted came

    def _got(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP and not self.hung_up:
            self.hung_up = True
            output_to_devnull()  # the terminal is gone; the run record and logs keep it all
        now = time.monotonic()
        if self._last is None or now - self._last >= SAME_STOP_S:
            self.count += 1
            self._last = now


@contextlib.contextmanager
def stop_signals() -> Iterator[Stops]:
    """Count Ctrl-C, SIGTERM and SIGHUP (unless ignored, as under nohup) during the block;
    the handlers from before are back after it. Only the main thread can set handlers:
    elsewhere nothing is counted. A hang-up killed the command, and the nodes of a local run
    (each in a session of its own) trained on, headless, until a write to the dead pipe."""
    stops = Stops()
    before = {}
    if threading.current_thread() is threading.main_thread():
        hangup = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
        before = {s: signal.signal(s, stops._got) for s in (*COMMAND_STOP_SIGNALS, *hangup)}
    try:
        yield stops
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)

"""A worker's progress, told to its agent's hang watchdog (trainer.hang): one line to add,
``progress.step(n)`` after each optimizer step (n: its number; omitted: one more).

A no-op outside torchjob's agent (``TORCHJOB_PROGRESS_DIR`` unset). ``start()`` runs a
heartbeat thread that beats while the interpreter runs, in a collective's wait too, and falls
silent when the process is stopped or frozen. The file and the heartbeat: docs/internals.md.
"""

from __future__ import annotations

import os
import threading
import time

from torchjob.trainer.contract import PROGRESS_DIR_ENV

BEAT_S = 1.0  # one heartbeat per second: a silent second is noise, five are a stop
RECORD_BYTES = 64
NO_STEP = -1  # in the file until the first step: judged by the heartbeat alone


class _Reporter:
    """This process's file and what it last wrote; one writer at a time (step and beat)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.step, self.beats, self.pid = NO_STEP, 0, os.getpid()
        self.lock = threading.Lock()
        self.write()

    def write(self) -> None:
        line = f"{self.step} {self.beats} {self.pid}".ljust(RECORD_BYTES - 1) + "\n"
        with self.lock:
            try:
                os.pwrite(self.fd, line.encode(), 0)
            except OSError:
                pass  # the agent removed the folder (it is ending): nothing to tell

    def beat_forever(self) -> None:
        while True:
            time.sleep(BEAT_S)
            self.beats += 1
            self.write()


_reporter: _Reporter | None = None


def start() -> None:
    """Open this worker's file and start its heartbeat, once, when the agent asked for
    reports; else nothing."""
    global _reporter
    folder, local_rank = os.environ.get(PROGRESS_DIR_ENV), os.environ.get("LOCAL_RANK")
    if _reporter is not None and _reporter.pid == os.getpid() or not folder or not local_rank:
        return
    try:
        _reporter = _Reporter(os.path.join(folder, local_rank))
    except OSError:
        return  # no folder (an agent of another version): no watchdog, no harm
    threading.Thread(target=_reporter.beat_forever, name="torchjob-heartbeat",
                     daemon=True).start()


def step(n: int | None = None) -> None:
    """An optimizer step finished: ``n`` is its number (omitted: the last one plus one, 1
    the first time)."""
    if _reporter is None:
        start()  # a script that calls this under the agent: its file is opened here
    if _reporter is None or _reporter.pid != os.getpid():  # not reporting, or a forked child
        return
    _reporter.step = max(_reporter.step, 0) + 1 if n is None else int(n)
    _reporter.write()

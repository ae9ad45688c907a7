"""A worker's progress, told to its agent's hang watchdog (trainer.hang). Nothing to add to a
script: the heartbeat thread counts its collectives and optimizer steps and notes where its
main thread is; ``progress.step(n)`` after each optimizer step is a finer signal.

A no-op outside torchjob's agent (``TORCHJOB_PROGRESS_DIR`` unset). ``start()`` runs a
heartbeat thread that beats while the interpreter runs, in a collective's wait too, and falls
silent when the process is stopped or frozen. The record and its fields: docs/internals.md.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from types import FrameType
from typing import Any

from torchjob.trainer import frames
from torchjob.trainer.contract import PROGRESS_DIR_ENV

BEAT_S = 1.0  # one heartbeat per second: a silent second is noise, five are a stop
RECORD_BYTES = 1024
NO_STEP = -1  # in the file until the first step: judged by the heartbeat alone
OPTIMIZER = "torch.optim.optimizer"


@dataclass
class Record:
    """What a worker last told: its step (``progress.step``), heartbeats, pid, the default
    process group's collective sequence number (-1: none), optimizer steps counted, whether
    its main thread waits inside torch.distributed, its innermost frame of user code, and the
    steps the run will take in all when the script said (``progress.step(n, total=T)``; -1)."""

    step: int = NO_STEP
    beats: int = 0
    pid: int = 0
    seq: int = -1
    optimizer_steps: int = 0
    in_collective: bool = False
    frame: str = ""
    total: int = -1
    exiting: str = ""  # its script returned; what the exit waits for (its threads, named)

    def encode(self) -> bytes:
        payload = json.dumps([self.step, self.beats, self.pid, self.seq, self.optimizer_steps,
                              int(self.in_collective), self.frame[:600], self.total,
                              self.exiting[:200]])
        line = f"{payload}\t{zlib.crc32(payload.encode()):08x}"
        return line.ljust(RECORD_BYTES - 1).encode()[:RECORD_BYTES - 1] + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Record | None:
        """The record in ``data``; None when it is half-written (its checksum is off)."""
        try:
            payload, crc = data.decode().strip().rsplit("\t", 1)
            if int(crc, 16) != zlib.crc32(payload.encode()):
                return None
            step, beats, pid, seq, opt, coll, frame, *more = json.loads(payload)
            return cls(int(step), int(beats), int(pid), int(seq), int(opt), bool(coll), str(frame),
                       int(more[0]) if more else -1, str(more[1]) if len(more) > 1 else "")
        except (ValueError, TypeError, UnicodeDecodeError):
            return None


def collective_seq() -> int:
    """The default process group's sequence number (collectives entered), -1 without one;
    torch is not imported here: a script that never did has no group."""
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    try:
        if c10d is None or not c10d.is_initialized():
            return -1
        return int(c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # a backend without sequence numbers, or a group being destroyed
        return -1


class _Reporter:
    """This process's file and what it last wrote; one writer at a time (step and beat)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.record = Record(pid=os.getpid())
        self.pid = self.record.pid
        self.main = threading.main_thread().ident
        self.lock = threading.Lock()
        self.write()

    def write(self) -> None:
        with self.lock:
            try:
                os.pwrite(self.fd, self.record.encode(), 0)
            except OSError:
                pass  # the agent removed the folder (it is ending): nothing to tell

    def look(self) -> None:
        """Where the main thread is (once the script ended: the first thread its exit still
        waits for), and the process group's count."""
        if self.record.exiting:
            self.hold(holding())
        self.record.seq = collective_seq()
        top: FrameType | None = sys._current_frames().get(self.main or 0)
        self.record.in_collective, self.record.frame = frames.where(top)

    def hold(self, threads: list[threading.Thread]) -> bool:
        """Tell that the exit waits for ``threads`` (whether any)."""
        if threads:
            names = ", ".join(repr(t.name) for t in threads[:4])
            self.record.exiting = f"its thread{'s' * (len(threads) > 1)} {names}"
            self.main = threads[0].ident
        return bool(threads)

    def beat_forever(self) -> None:
        while True:
            time.sleep(BEAT_S)
            self.record.beats += 1
            self.look()
            self.write()

    def optimizer_step(self, *_: Any) -> None:
        self.record.optimizer_steps += 1


_reporter: _Reporter | None = None


def start() -> None:
    """Open this worker's file and start its heartbeat, once, when the agent asked for
    reports; else nothing. Call it from the main thread."""
    global _reporter
    folder, local_rank = os.environ.get(PROGRESS_DIR_ENV), os.environ.get("LOCAL_RANK")
    if _reporter is not None and _reporter.pid == os.getpid() or not folder or not local_rank:
        return
    try:
        _reporter = _Reporter(os.path.join(folder, local_rank))
    except OSError:
        return  # no folder (an agent of another version): no watchdog, no harm
    frames.after_import(OPTIMIZER, _count_optimizer_steps)
    atexit.register(_last_word)  # the steps of the last second, for the agent's count (status)
    threading.Thread(target=_reporter.beat_forever, name="torchjob-heartbeat",
                     daemon=True).start()


def holding() -> list[threading.Thread]:
    """The threads an exit waits for: alive, not daemons, not the main one; those the exit
    ends itself (an idle ThreadPoolExecutor's, at threading's own atexit) last."""
    main = threading.main_thread()
    found = [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]
    return sorted(found, key=lambda t: t.name.startswith("ThreadPoolExecutor"))


def exiting() -> None:
    """The script ended and its exit waits for threads that are not daemons (``holding``):
    the heartbeat tells so, with their names, and where the first of them is, for the agent's
    hang watchdog; nothing when none is left."""
    reporter = _reporter
    if reporter is not None and reporter.pid == os.getpid() and reporter.hold(holding()):
        reporter.look()
        reporter.write()


def _last_word() -> None:
    reporter = _reporter
    if reporter is not None and reporter.pid == os.getpid():
        reporter.write()


def _count_optimizer_steps(module: Any) -> None:
    """Every optimizer's steps, counted by torch's global hook (in the importing thread: the
    hooks are a dict that a step iterates)."""
    reporter = _reporter
    if reporter is not None and reporter.pid == os.getpid():
        module.register_optimizer_step_post_hook(reporter.optimizer_step)


def step(n: int | None = None, total: int | None = None) -> None:
    """An optimizer step finished: ``n`` is its number (omitted: the last one plus one, 1
    the first time); ``total``, the steps the run takes in all (``torchjob status`` shows the
    ETA from it)."""
    if _reporter is None:
        start()  # a script that calls this under the agent: its file is opened here
    if _reporter is None or _reporter.pid != os.getpid():  # not reporting, or a forked child
        return
    record = _reporter.record
    record.step = max(record.step, 0) + 1 if n is None else int(n)
    if total is not None:
        record.total = int(total)
    _reporter.write()

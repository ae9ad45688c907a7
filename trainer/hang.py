"""The hang watchdog, the agent's side: no progress for ``hang_timeout`` -> stacks written, the
stuck rank named, the group restarted from its last checkpoint like after a lost worker.

It reads each local worker's progress file (trainer.progress) and ``/proc``, timed by this
agent's clock. The stuck ranks are the silent or stopped ones; a node without one waits
``others_first_s`` for the node that has one. The rules in full: docs/internals.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from torchjob.trainer.progress import BEAT_S, NO_STEP

READ_EVERY_S = 1.0  # how often the agent reads the progress files
BEAT_LOST_S = 5 * BEAT_S  # no heartbeat for this long: the process is stopped or frozen
# Every node writes its stacks this long before the timeout: the node that acts on the hang
# kills its workers at the timeout, and the peers on other nodes exit as soon as they lose them
DUMP_LEAD_S = 2 * READ_EVERY_S
PY_SPY_TIMEOUT_S = 20.0  # per process
STOPPED = ("T", "t")  # /proc/PID/stat states: stopped by a signal, stopped by a tracer


@dataclass
class Seen:
    """One local worker as this agent last saw it (times on the agent's monotonic clock)."""

    local_rank: int
    rank: int
    pid: int
    started: float
    step: int = NO_STEP
    beats: int = -1  # -1: its file not seen yet (not judged)
    step_at: float = 0.0
    beat_at: float = 0.0
    state: str = "?"  # /proc state letter; "" when the process is gone

    def __post_init__(self) -> None:
        self.step_at = self.beat_at = self.started

    @property
    def alive(self) -> bool:
        return self.state not in ("", "Z", "X")

    def silent_for(self, now: float) -> float:
        return now - self.beat_at

    def idle_for(self, now: float) -> float:
        """Seconds without progress: since its last new step, or before the first one since
        its last heartbeat."""
        return now - (self.step_at if self.step != NO_STEP else self.beat_at)

    def silent(self, now: float) -> bool:
        return self.alive and self.beats >= 0 and (
            self.state in STOPPED or self.silent_for(now) >= BEAT_LOST_S)

    def describe(self, now: float) -> str:
        last = f"last step {self.step}" if self.step != NO_STEP else "no step yet"
        if self.state in STOPPED:
            how = "its process is stopped (state T)"
        elif self.silent(now):
            how = f"no heartbeat for {self.silent_for(now):.0f} s"
        else:
            how = "alive"
        return f"{last}, {how}"


@dataclass(frozen=True)
class Hang:
    """A node's overdue group: the stuck workers and one line that says why."""

    stuck: tuple[Seen, ...]
    why: str
    act: bool  # this node acts now (else it waits for the node where the hang began)


def read_record(path: Path) -> tuple[int, int, int] | None:
    """(step, beats, pid) from a progress file; None when absent or half-written."""
    try:
        words = path.read_bytes().split()
        step, beats, pid = (int(w) for w in words[:3])
    except (OSError, ValueError):
        return None
    return step, beats, pid


def process_state(pid: int) -> str:
    """The state letter of ``pid`` in /proc (R, S, D, T, Z, ...); "" when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2:].split(" ", 1)[0]


def overdue(seen: Iterable[Seen], now: float, timeout: float) -> bool:
    """Some live, reporting worker made no progress (or was silent) for ``timeout``."""
    return any(w.alive and w.beats >= 0 and w.idle_for(now) >= timeout for w in seen)


def stuck(seen: list[Seen], now: float) -> tuple[list[Seen], bool]:
    """(the stuck workers, whether they are silent): the silent ones if any; else the live
    reporting ones whose last step is the lowest (behind the others, or all at one step)."""
    silent = [w for w in seen if w.silent(now)]
    if silent:
        return silent, True
    live = [w for w in seen if w.alive and w.beats >= 0]
    low = min((w.step for w in live), default=NO_STEP)
    return [w for w in live if w.step == low], False


def check(seen: list[Seen], now: float, timeout: float, *, nodes: int, overdue_since: float,
          others_first_s: float) -> Hang | None:
    """The decision, pure: None while the group progresses; else who is stuck and whether
    this node acts now (docs/internals.md)."""
    if not overdue(seen, now, timeout):
        return None
    names, silent = stuck(seen, now)
    steps = sorted({w.step for w in seen if w.alive and w.beats >= 0})
    ranks = ", ".join(f"rank {w.rank} ({w.describe(now)})" for w in names)
    if silent:
        why = f"{ranks} stuck: no progress for {timeout:g} s"
    elif len(steps) > 1:
        why = f"{ranks} behind the others (steps {steps}): no progress for {timeout:g} s"
    else:
        why = (f"no progress for {timeout:g} s and no rank of this node stopped: "
               f"{ranks} waiting (a deadlock, or a peer on another node)")
    act = silent or nodes <= 1 or now - overdue_since >= others_first_s
    return Hang(tuple(names), why, act)


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each (it ends a stopped process too); a process already gone is fine."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_stopped(pids: Iterable[int]) -> list[int]:
    """SIGKILL the stopped ones: torch stops workers with SIGTERM and waits 30 s, and a
    stopped process acts on SIGTERM only once continued. Their pids."""
    stopped = [pid for pid in pids if process_state(pid) in STOPPED]
    kill(stopped)
    return stopped


def py_spy() -> str | None:
    """The py-spy program: on PATH, or next to this interpreter (a venv not activated)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


def stack_of(pid: int) -> str:
    """The Python stacks of every thread of ``pid``, or why not and what /proc knows."""
    program = py_spy()
    problem = "py-spy is not installed (pip install py-spy)"
    if program is not None:
        try:
            done = subprocess.run([program, "dump", "--pid", str(pid), "--nonblocking"],
                                  capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
            if done.returncode == 0:
                return done.stdout
            problem = f"py-spy failed (exit {done.returncode}): {done.stderr.strip()[:2000]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"py-spy failed: {exc}"
    return f"{problem}\n{proc_view(pid)}"


def proc_view(pid: int) -> str:
    """What /proc says of a process when no Python stack can be had."""
    lines = []
    for name in ("wchan", "status"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text()
        except OSError as exc:
            text = f"({exc.strerror})"
        lines.append(f"{name}: " + (text if name == "wchan" else " ".join(
            line for line in text.splitlines() if line.startswith(("State", "Threads")))))
    tasks = Path(f"/proc/{pid}/task")
    for task in sorted(tasks.iterdir()) if tasks.is_dir() else []:
        lines.append(f"thread {task.name}: state {process_state(int(task.name))}")
    return "\n".join(lines) + "\n"


class Watchdog:
    """One agent's watch over its local workers (torchjob.trainer.torchrun_agent calls it)."""

    def __init__(self, folder: Path, timeout: float, *, others_first_s: float,
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.folder, self.timeout, self.others_first_s = folder, timeout, others_first_s
        self.say, self.clock = say, clock
        self.seen: list[Seen] = []
        self.read_at = self.overdue_since = 0.0
        self.dumped = False

    def clear(self) -> None:
        """Before a group starts: no file of the last one is read as this one's."""
        for path in self.folder.glob("*"):
            path.unlink(missing_ok=True)

    def reset(self, workers: Iterable[tuple[int, int, int]]) -> None:
        """A new group started: (local rank, global rank, pid) of each worker."""
        now = self.clock()
        self.seen = [Seen(local, rank, pid, now) for local, rank, pid in workers]
        self.read_at, self.overdue_since, self.dumped = now, 0.0, False

    def observe(self, force: bool = False) -> float:
        """Read the files (at most once per READ_EVERY_S unless ``force``); the time."""
        now = self.clock()
        if not force and now - self.read_at < READ_EVERY_S:
            return now
        self.read_at = now
        for w in self.seen:
            w.state = process_state(w.pid)
            record = read_record(self.folder / str(w.local_rank))
            if record is None or record[2] != w.pid:
                continue
            step, beats, _ = record
            if step != w.step:
                w.step, w.step_at = step, now
            if beats != w.beats:
                w.beats, w.beat_at = beats, now
        return now

    def poll(self, nodes: int) -> Hang | None:
        """While the group runs: a Hang when this node should act on one, else None (it
        writes the stacks the first time the group is overdue)."""
        before = self.read_at
        now = self.observe()
        if self.read_at == before:  # nothing new read
            return None
        if not overdue(self.seen, now, self.timeout - DUMP_LEAD_S):
            self.overdue_since, self.dumped = 0.0, False
            return None
        self.overdue_since = self.overdue_since or now  # the stacks are due (first_dump)
        hang = check(self.seen, now, self.timeout, nodes=nodes,
                     overdue_since=self.overdue_since, others_first_s=self.others_first_s)
        return hang if hang is not None and hang.act else None

    def first_dump(self) -> bool:
        """True once per overdue stretch: the caller writes the stacks then."""
        if self.dumped or not self.overdue_since:
            return False
        self.dumped = True
        return True

    def silent(self) -> list[Seen]:
        """After another failure: the workers that are silent or stopped now."""
        now = self.observe(force=True)
        return [w for w in self.seen if w.silent(now)]

    def dump(self, folder: Path | None, node: int, workers: Iterable[Seen]) -> str:
        """Every given worker's stacks into ``folder`` (or the log); where they went."""
        now = self.clock()
        texts = {}
        for w in workers:
            head = (f"node {node} rank {w.rank} (local rank {w.local_rank}) pid {w.pid}: "
                    f"{w.describe(now)}; last new step {now - w.step_at:.1f} s ago, last "
                    f"heartbeat {now - w.beat_at:.1f} s ago\n\n")
            texts[w.rank] = head + stack_of(w.pid)
        if folder is not None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                for rank, text in texts.items():
                    (folder / f"node{node}-rank{rank}.txt").write_text(text)
                return str(folder)
            except OSError as exc:
                self.say(f"torchjob: cannot write the stacks into {folder} ({exc}): here")
        for text in texts.values():
            self.say(text)
        return "the log above"

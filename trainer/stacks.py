"""Processes from outside: their state in /proc, their Python stacks (py-spy, which reads a
stopped process too), and SIGKILL. The hang watchdog's tools (trainer.hang)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable

from torchjob.trainer.contract import SERVER_NAME
from torchjob.trainer.culprit import STOPPED
from torchjob.trainer.frames import pick

PY_SPY_TIMEOUT_S = 20.0  # per process
FRAME_TIMEOUT_S = 5.0  # one look at a silent rank's frame, from the agent's watch loop


def process_state(pid: int) -> str:
    """The state letter of ``pid`` in /proc (R, S, D, T, Z, ...); "" when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2:].split(" ", 1)[0]


def process_name(pid: int) -> str:
    """What ps calls ``pid`` (/proc/PID/comm); "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children(pid: int) -> list[tuple[int, str]]:
    """The direct children of ``pid`` from /proc: (pid, name), the name as ps shows it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        if int(rest.split(" ", 2)[1]) == pid:
            found.append((int(entry.name), name))
    return found


def kill_deaf(pids: Iterable[int]) -> None:
    """SIGKILL the workers a SIGTERM would not end: the stopped ones (``kill_stopped``) and
    those not yet the trainer, still named after the fork server, whose stop signals they
    ignore (torchjob.trainer.agent: each worker hears them again before it takes its name)."""
    pids = list(pids)
    kill_stopped(pids)
    kill([pid for pid in pids if process_name(pid) == SERVER_NAME])


def half_started(agent: int) -> list[int]:
    """The workers of a start that a stop cut short, in no context of torch's yet (``agent``'s
    exit, which joins its children, waited on one until its rendezvous timed out): those
    forked for it (whose parent is its fork server) and its own children (a script's), but
    the server."""
    forked = [proc.pid for proc in multiprocessing.active_children() if proc.pid is not None]
    return forked + [pid for pid, name in children(agent) if name != SERVER_NAME]


def wchan(pid: int) -> str:
    """Where in the kernel ``pid`` waits (e.g. pipe_read, do_nanosleep); "" when unknown."""
    try:
        text = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return ""
    return "" if text in ("0", "") else text


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


def frame_of(pid: int) -> str:
    """Where ``pid``'s main thread is now, read from outside (py-spy) as ``frames.pick``
    words it: for a rank whose heartbeat cannot tell (stopped, or frozen holding the GIL).
    "" when it cannot be read."""
    program = py_spy()
    if program is None:
        return ""
    try:
        done = subprocess.run([program, "dump", "--pid", str(pid), "--nonblocking", "--json",
                               "--full-filenames"], capture_output=True, text=True,
                              timeout=FRAME_TIMEOUT_S, stdin=subprocess.DEVNULL)
        threads = json.loads(done.stdout) if done.returncode == 0 else []
        main = next((t for t in threads if t.get("os_thread_id") == pid), None) or next(
            (t for t in threads if t.get("thread_name") == "MainThread"), None)
        if main is None:
            return ""
        chain = [(str(f["filename"]), int(f["line"]), str(f["name"])) for f in main["frames"]]
        return pick(chain, os.readlink(f"/proc/{pid}/cwd"))[1]
    except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired):
        return ""


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

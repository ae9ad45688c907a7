"""One live run per run directory: a lock file every node's agent holds while its job runs.

``RUN_DIR/.torchjob/lock`` is a JSON record, created atomically and renewed every
``HEARTBEAT_S`` by every agent of its run. Another live run's lock is refused (exit 2, naming
its run, host and pid), one of the same run joined, a stale one taken over; the last agent to
leave removes it. Standard library only. Why no flock, and when a lock is stale: docs/internals.md.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

LOCK = Path(".torchjob") / "lock"
HEARTBEAT_S = 5.0
STALE_S = 30.0


class RunDirBusy(Exception):
    """Another live run holds the run directory."""


def pid_start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), which tells a reused pid apart;
    None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in (b"Z", b"X") else fields[19].decode()


def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _me(run_id: str) -> dict[str, Any]:
    pid = os.getpid()
    return {"run_id": run_id, "host": socket.gethostname(), "pid": pid,
            "pid_start": pid_start(pid), "pid_ns": _pid_ns(), "since": time.time()}


def describe(owner: dict[str, Any]) -> str:
    """``run digits-1a2b3c (host n1, pid 4242, since 12:00:03)``."""
    since = time.strftime("%H:%M:%S", time.localtime(owner.get("since", 0)))
    return (f"run {owner.get('run_id')!s} (host {owner.get('host')!s}, pid {owner.get('pid')!s}, "
            f"since {since})")


def stale(owner: dict[str, Any], age: float) -> str | None:
    """Why a lock renewed ``age`` seconds ago is stale, or None while its run may be alive."""
    if age >= STALE_S:
        return f"not renewed for {age:.0f} s"
    same_space = owner.get("host") == socket.gethostname() and owner.get("pid_ns") == _pid_ns()
    if same_space and age >= 2 * HEARTBEAT_S:
        pid = owner.get("pid")
        if not isinstance(pid, int) or pid_start(pid) != owner.get("pid_start"):
            return "its process is gone"
    return None


def read(path: Path) -> tuple[dict[str, Any], float] | None:
    """The lock's record (empty when unreadable) and when it was last renewed; None: no lock."""
    try:
        text, mtime = path.read_text(), path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        owner = json.loads(text)
    except ValueError:
        owner = {}
    return (owner if isinstance(owner, dict) else {}), mtime


def clear(run_dir: str | os.PathLike[str], run_id: str) -> bool:
    """Remove ``run_dir``'s lock if the run ``run_id`` holds it; whether it did. For an agent
    leaving, and for a launcher that has seen every agent of that run end, however they ended:
    an agent killed in a container could not remove it, and from another host or PID namespace
    nobody can tell that it is gone before ``STALE_S``, so the next run there would be refused
    until then."""
    path = Path(run_dir) / LOCK
    found = read(path)
    if found is None or found[0].get("run_id") != run_id:
        return False
    path.unlink(missing_ok=True)
    return True


class RunLock:
    """The lock of ``run_dir`` for the run ``run_id``, held from ``acquire`` to ``release``."""

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str,
                 say: Any = print) -> None:
        self.run_dir, self.path = Path(run_dir), Path(run_dir) / LOCK
        self.run_id, self.say = run_id, say
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _create(self) -> bool:
        """Write our record at the lock's place unless one is there (atomic, NFS-safe)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".lock-{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(_me(self.run_id)))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def acquire(self) -> None:
        """Take or join the lock; RunDirBusy when another live run holds it."""
        for _ in range(10):  # a race with another starter or a leaving owner: look again
            if self._create():
                break
            found = read(self.path)
            if found is None:
                continue
            owner, mtime = found
            if owner.get("run_id") == self.run_id:
                break
            why = stale(owner, time.time() - mtime)
            if why is None:
                raise RunDirBusy(
                    f"the run directory {self.run_dir} is in use by {describe(owner)}: "
                    "one live run per run directory. Wait for it to end, cancel it (torchjob "
                    "cancel), or give this job another run_dir")
            self.say(f"torchjob: taking over the lock of {self.run_dir} from "
                     f"{describe(owner)}: {why}")
            gone = self.path.with_name(f".lock-stale-{uuid.uuid4().hex}")
            try:
                os.rename(self.path, gone)
                gone.unlink()
            except FileNotFoundError:
                pass
        else:
            raise RunDirBusy(f"could not take the lock {self.path}: it keeps changing hands")
        self._beat = threading.Thread(target=self._heartbeat, name="torchjob-runlock",
                                      daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                found = read(self.path)
                if found is None:
                    self._create()
                elif found[0].get("run_id") == self.run_id:
                    os.utime(self.path)
            except OSError:
                pass  # storage hiccup: the next beat tries again

    def release(self) -> None:
        """Stop renewing; remove the lock if it is still this run's."""
        self._stop.set()
        if self._beat is not None:
            clear(self.run_dir, self.run_id)

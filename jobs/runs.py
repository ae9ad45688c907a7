"""Runs on this machine (the local and docker backends) recorded as jobs, so that ``torchjob
status|logs|cancel BACKEND:RUN_ID`` and ``torchjob list`` work for them from any terminal and
any directory, as for a cluster's jobs.

A run's record, ``RUN_DIR/.torchjob/RUN_ID/``, is found through a per-user index under
``$XDG_STATE_HOME/torchjob/runs/``; once the launcher runs, it alone writes the record's
``run.json``. Core module: imports no backend. The record's files: docs/internals.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchjob.jobs.backend import BackendError, Handle, JobStatus, State
from torchjob.jobs.values import UserError
from torchjob.trainer.contract import EXIT_OK, EXIT_STOPPED
from torchjob.trainer.dirs import write_whole
from torchjob.trainer.runlock import pid_start

RECORD_DIR = ".torchjob"  # under the run directory
RECORD = "run.json"
LAUNCHER_LOG = "launcher.log"
OUTPUT_LOG = "output.log"  # every line of the run in the order it came (torchjob logs)
FOLLOW_POLL_S = 0.2
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def state_home(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_STATE_HOME/torchjob`` (default ``~/.local/state/torchjob``)."""
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                          "state")
    return Path(base) / "torchjob"


def index_dir(backend: str) -> Path:
    return state_home() / "runs" / backend


def check_run_id(backend: str, text: str) -> str:
    """A run id as ``torchjob submit`` printed it (``NAME-1a2b3c``); else a BackendError."""
    if not RUN_ID.fullmatch(text):
        raise BackendError(f"{backend}:{text!r} is not a run id: write {backend}:RUN_ID as "
                           f"torchjob submit or run printed it (torchjob list --to {backend} "
                           "shows them)")
    return text


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Proc:
    """A process, told apart from a later one with the same pid by its start time."""

    pid: int
    start: str
    host: str
    boot: str

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        start = pid_start(pid)
        return None if start is None else cls(pid, start, socket.gethostname(), _boot_id())

    @classmethod
    def load(cls, raw: Mapping[str, Any]) -> Proc:
        return cls(int(raw["pid"]), str(raw["start"]), str(raw["host"]), str(raw["boot"]))

    def here(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Still this very process (same host, boot, pid and start time)."""
        return self.here() and self.boot == _boot_id() and pid_start(self.pid) == self.start


def state_of(code: int) -> State:
    """The state a run ended in, from its exit code (README's table)."""
    return {EXIT_OK: State.SUCCEEDED, EXIT_STOPPED: State.STOPPED}.get(code, State.FAILED)


class Record:
    """One run's record directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.unwritable: OSError | None = None  # the first write that failed, once running

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A write to the record of a running job: one that fails (a full disk, a quota, a
        file system gone read-only) must not end the launcher, which still follows and stops
        the nodes. The first failure is said on stderr; later writes are tried again."""
        try:
            yield
        except OSError as exc:
            if self.unwritable is None:
                self.unwritable = exc
                with contextlib.suppress(OSError, ValueError):  # stderr may be on that disk
                    print(f"torchjob: cannot write the run's record {self.path} ({exc}); the "
                          "run goes on, but torchjob logs and status miss what was not "
                          "written", file=sys.stderr, flush=True)

    @property
    def launcher_log(self) -> Path:
        return self.path / LAUNCHER_LOG

    @property
    def output_log(self) -> Path:
        """Every line of the run, the nodes' and the launcher's, in the order they came."""
        return self.path / OUTPUT_LOG

    def append_output(self, raw: bytes) -> None:
        """One whole line onto ``output_log`` (O_APPEND: lines from the node pumps and the
        launcher never split one another); one that cannot be written is said (``writing``)."""
        with self.writing():
            fd = os.open(self.output_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, raw)
            finally:
                os.close(fd)

    def node_log(self, node: int) -> Path:
        return self.path / f"node-{node}.log"

    def node_logs(self) -> list[Path]:
        found = [(int(p.stem[5:]), p) for p in self.path.glob("node-*.log")
                 if p.stem[5:].isdigit()]
        return [path for _, path in sorted(found)]

    def read(self) -> dict[str, Any]:
        with open(self.path / RECORD) as f:
            data: dict[str, Any] = json.load(f)
        return data

    def update(self, **fields: Any) -> None:
        """Merge ``fields`` into run.json, atomically (readers see the old or the new)."""
        data = {**self.read(), **fields}
        write_whole(self.path / RECORD, json.dumps(data, indent=1, default=str) + "\n",
                    self.path / f".{RECORD}.{os.getpid()}.tmp")

    def launched(self) -> None:
        """This process is the run's launcher, and the run has started; a UserError when the
        record cannot be written, before any node starts."""
        me = Proc.of(os.getpid())
        try:
            self.update(state=State.RUNNING.value, started=time.time(),
                        launcher=None if me is None else me.__dict__)
        except OSError as exc:
            raise unwritable(self.path, exc) from None

    def finished(self, code: int, detail: str = "") -> None:
        with self.writing():
            self.update(state=state_of(code).value, exit_code=code, ended=time.time(),
                        detail=detail)


def unwritable(path: Path, exc: OSError) -> UserError:
    """Nothing started: the run's record cannot be written (a full disk, a quota, no right)."""
    return UserError(f"cannot write the run's record in {path}: {exc}. Free space there (or "
                     "fix its permissions), or set run_dir to another file system")


def create(backend: str, run_id: str, run_dir: Path, *, name: str,
           request: Mapping[str, Any], foreground: bool = True) -> Record:
    """A new record in ``run_dir`` (made if need be), indexed under ``BACKEND/RUN_ID``; this
    process is its launcher until ``detach`` hands over. A job that cannot be indexed is
    refused unless it runs in the ``foreground`` (submitted, nothing could find it)."""
    check_run_id(backend, run_id)
    path = run_dir.resolve() / RECORD_DIR / run_id
    me = Proc.of(os.getpid())
    try:
        path.mkdir(parents=True)
        (path / RECORD).write_text(json.dumps({
            "backend": backend, "id": run_id, "name": name, "run_dir": str(run_dir.resolve()),
            "created": time.time(), "state": State.PENDING.value, "exit_code": None,
            "detail": "", "launcher": None if me is None else me.__dict__,
            "request": dict(request)}, indent=1, default=str) + "\n")
    except FileExistsError:
        raise UserError(f"{backend}:{run_id} exists already ({path})") from None
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)  # what a full disk let it make, if anything
        raise unwritable(path, exc) from None
    index = index_dir(backend)
    try:
        index.mkdir(parents=True, exist_ok=True)
        (index / run_id).write_text(str(path) + "\n")
    except OSError as exc:  # a home that is read-only (as on some clusters' nodes) or full
        said = (f"cannot write the index of this machine's runs, {index} ({exc}): torchjob "
                "status, cancel and list cannot find this run")
        fix = "set XDG_STATE_HOME to a directory you can write"
        if not foreground:
            shutil.rmtree(path, ignore_errors=True)
            raise UserError(f"{said} once submitted: {fix}, or use torchjob run") from None
        print(f"torchjob: {said} (torchjob logs finds it with --log-dir {run_dir}); {fix}",
              file=sys.stderr, flush=True)
    return Record(path)


def find(backend: str, run_id: str, log_dir: str | None = None) -> Record:
    """The record of ``BACKEND:RUN_ID``: from the index, or from ``log_dir`` (the record's
    directory or its run directory) when given. ``RUN_ID`` may be a job's name instead: its
    latest run here."""
    check_run_id(backend, run_id)
    if log_dir is not None:
        for path in (Path(log_dir), Path(log_dir) / RECORD_DIR / run_id):
            if (path / RECORD).is_file():
                return Record(path)
        raise UserError(f"{log_dir}: holds no record of {backend}:{run_id} (give the run "
                        f"directory or RUN_DIR/{RECORD_DIR}/{run_id})")
    try:
        path = Path((index_dir(backend) / run_id).read_text().strip())
    except FileNotFoundError:
        named = [r for r in records(backend) if r.read().get("name") == run_id]
        if named:  # a job's name: its latest run (records() is newest first)
            return named[0]
        raise UserError(f"no {backend} run {run_id!r} on this machine for this user: give a "
                        f"run id or a job's name (torchjob list --to {backend} shows "
                        "them)") from None
    if not (path / RECORD).is_file():
        raise UserError(f"{backend}:{run_id}: its record {path} is gone (was the run "
                        "directory removed?)")
    return Record(path)


def records(backend: str) -> list[Record]:
    """Every indexed run of ``backend`` whose record still exists, newest first."""
    found = []
    index = index_dir(backend)
    for entry in sorted(index.iterdir()) if index.is_dir() else []:
        try:
            record = Record(Path(entry.read_text().strip()))
            found.append((float(record.read()["created"]), record))
        except (OSError, ValueError, KeyError):
            continue  # a record removed with its run directory, or being written
    return [record for _, record in sorted(found, key=lambda cr: -cr[0])]


def _still_running(raw: Any) -> list[int]:
    procs = [Proc.load(p) for p in raw or ()]
    return [p.pid for p in procs if p.alive()]


def status(record: Record, handle: Handle) -> JobStatus:
    """The run's state from its record; a launcher that ended without writing its result is
    FAILED with a detail that says so (never RUNNING forever)."""
    data = record.read()
    state = State(data["state"])
    detail = data.get("detail", "")
    raw = {**{key: value for key, value in data.items() if key != "request"},
           "record": str(record.path),
           "logs": [str(p) for p in record.node_logs()] + [str(record.launcher_log)]}
    if not state.terminal and data.get("launcher"):
        launcher = Proc.load(data["launcher"])
        if not launcher.here():
            state = State.UNKNOWN
            detail = (f"launched on host {launcher.host}: its live state is known only "
                      "there")
        elif not launcher.alive():
            state = State.FAILED
            detail = (f"the launcher (pid {launcher.pid}) ended without writing the run's "
                      "result: it was killed (SIGKILL, out of memory) or the machine "
                      "restarted; see its logs")
            if left := _still_running(data.get("nodes")):
                detail += (f"; its node processes {', '.join(map(str, left))} are still "
                           f"running (kill them: kill -TERM -PID for each)")
    return JobStatus(handle=handle, state=state, exit_code=data.get("exit_code"),
                     name=data.get("name", ""), detail=detail, raw=raw,
                     created=data.get("created"), run_dir=data.get("run_dir", ""))


def cancel(record: Record, handle: Handle) -> str:
    """As Ctrl-C: SIGTERM to the launcher, whose workers checkpoint and exit 143 (a second
    cancel kills them at once)."""
    data = record.read()
    if State(data["state"]).terminal:
        return f"{handle} has already ended: {data['state']}" + (
            f" (exit code {data['exit_code']})" if data.get("exit_code") is not None else "")
    launcher = Proc.load(data["launcher"])
    if not launcher.alive():  # never a signal to a pid that is no longer the launcher's
        raise UserError(f"{handle}: {status(record, handle).detail}")
    try:
        os.kill(launcher.pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"{handle} has just ended"
    except PermissionError:
        raise UserError(f"{handle}: not allowed to signal its launcher (pid "
                        f"{launcher.pid}): it runs as another user") from None
    return (f"{handle}: SIGTERM sent to its launcher (pid {launcher.pid}): the workers "
            "checkpoint and exit 143 (cancel again to kill them now)")


def _complete_lines(path: Path, offset: int, final: bool) -> tuple[list[str], int]:
    """Whole lines of ``path`` from byte ``offset`` (and, when ``final``, a last partial
    one); the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return [], offset
    end = len(chunk) if final else chunk.rfind(b"\n") + 1
    text = chunk[:end].decode(errors="replace")
    return text.splitlines(), offset + end


def logs(record: Record, handle: Handle, *, follow: bool = False,
         sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """Every line of the run in the order it came, the nodes' (each with the log prefix or
    ``[node I] ``) and the launcher's (a run recorded before output.log existed: every node's
    lines, then the launcher's); with ``follow``, new lines as they come until the run has
    ended."""
    offsets: dict[Path, int] = {}
    while True:
        ended = not follow or status(record, handle).state.terminal
        paths = [record.output_log] if record.output_log.exists() or not (
            record.node_logs() or record.launcher_log.exists()) else \
            [*record.node_logs(), record.launcher_log]
        for path in paths:
            lines, offsets[path] = _complete_lines(path, offsets.get(path, 0), ended)
            yield from lines
        if ended:
            return
        sleep(FOLLOW_POLL_S)


class RecordedRuns:
    """``status``, ``logs``, ``cancel``, ``list`` and handles for a backend whose runs are
    recorded here (``BACKEND:RUN_ID``)."""

    name: str = ""

    def parse_handle(self, text: str) -> Handle:
        return Handle(self.name, check_run_id(self.name, text))

    def _found(self, handle: Handle, log_dir: str | None = None) -> tuple[Record, Handle]:
        """The record of a run id, or of a job name's latest run; the run's own handle."""
        record = find(self.name, handle.id, log_dir)
        return record, Handle(self.name, record.path.name)

    def status(self, handle: Handle) -> JobStatus:
        return status(*self._found(handle))

    def logs(self, handle: Handle, *, follow: bool = False,
             log_dir: str | None = None) -> Iterator[str]:
        return logs(*self._found(handle, log_dir), follow=follow)

    def cancel(self, handle: Handle) -> str:
        return cancel(*self._found(handle))

    def list(self) -> list[JobStatus]:
        return [status(record, Handle(self.name, record.path.name))
                for record in records(self.name)]

"""What a launcher on this machine (the local and docker backends) does with its run's
record (``torchjob.jobs.runs``): run as the record's launcher (``perform``), or detached from the
terminal in a session of its own (``detach``, for ``submit``); count the stop signals it gets
(``Stops``), from before the record names it the launcher until its result is written; each
node's lines to its log in the record and the terminal (``NodeOutput``); its own lines to
both (``tee``). Core module: imports no backend.
"""

from __future__ import annotations

import abc
import dataclasses
import io
import os
import select
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from torchjob.jobs import runs
from torchjob.jobs.backend import Backend, ClosingLines, Handle, Request
from torchjob.jobs.runs import Record
from torchjob.jobs.stops import Stops, stop_signals
from torchjob.jobs.values import UserError
from torchjob.trainer.contract import (CLOSING, EXIT_CONFIG, EXIT_FAILED, LOG_PREFIX_RE,
                                        NODE_PREFIX)

START_TIMEOUT_S = 60.0  # a detached launcher that has not recorded itself by then failed

def perform(record: Record, body: Callable[[Stops], int]) -> int:
    """Run the launcher ``body`` as the record's launcher: RUNNING, then its exit code (a
    UserError: 2, raised again; any other exception: 1, raised again). The stop signals are
    counted (``body`` acts on them) from before the record names this process the launcher
    until the result is written: a ``torchjob cancel`` or Ctrl-C that comes at any moment
    stops the run and never kills the launcher before the result is written."""
    with stop_signals() as stops:
        record.launched()
        try:
            code = body(stops)
        except UserError as exc:
            record.finished(EXIT_CONFIG, str(exc))
            raise
        except BaseException as exc:
            record.finished(EXIT_FAILED, f"the launcher failed: {type(exc).__name__}: {exc}")
            raise
        record.finished(code)
    return code


def detach(record: Record, body: Callable[[Stops], int]) -> None:
    """Run ``perform(record, body)`` in a new session, detached from this process and its
    terminal (a grandchild: it outlives this process; stdin from /dev/null, stdout and stderr
    to the record's launcher.log). Returns once it has recorded itself as the launcher; if it
    could not, a UserError that names its log."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child (covered by the integration tests)
        code = EXIT_FAILED
        try:
            os.close(read)
            os.setsid()
            if os.fork():
                os._exit(0)
            null = os.open(os.devnull, os.O_RDONLY)
            log = os.open(record.launcher_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(null)
            os.close(log)
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, io.TextIOWrapper):
                    stream.reconfigure(line_buffering=True)

            def started(stops: Stops) -> int:
                os.write(write, b"started")
                os.close(write)
                return body(stops)

            code = perform(record, started)
        except UserError as exc:
            print(f"torchjob: {exc}", file=sys.stderr)
            code = EXIT_CONFIG
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(write)
    os.waitpid(pid, 0)  # the child exits as soon as the grandchild exists
    got = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    with os.fdopen(read, "rb") as pipe:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(pipe.fileno(), 64) if ready else b""
            got += chunk
            if not chunk:
                break
    if got != b"started":
        tail = "".join(record.launcher_log.read_text(errors="replace").splitlines(True)[-20:]) \
            if record.launcher_log.exists() else ""
        raise UserError(f"the launcher of {record.path.name} did not start (see "
                        f"{record.launcher_log}){':' if tail else ''}\n{tail}".rstrip())


class NodeOutput:
    """Where each node's lines go: its log file in the record (when there is one) and, in the
    foreground, the terminal. A worker's line already carries the log prefix; any other line
    (the agent's own) gets ``[node I] ``. One line, one write. The agents' closing lines (why
    the job failed) are noted in ``closings``."""

    def __init__(self, record: Record | None, *, out: IO[bytes] | None,
                 err: IO[bytes] | None) -> None:
        self.record, self.out, self.err = record, out, err
        self.lock = threading.Lock()
        self.files: dict[int, IO[bytes]] = {}
        self.closed = False
        self.closings = ClosingLines()  # the agents' closing lines

    def line(self, node: int, raw: bytes, *, stderr: bool = False) -> None:
        if raw.startswith(_CLOSING):
            self.closings.see(raw.decode(errors="replace"))
        if not LOG_PREFIX_RE.match(raw[:100].decode(errors="replace")):
            raw = NODE_PREFIX.format(node=node).encode() + raw
        if not raw.endswith(b"\n"):
            raw += b"\n"
        with self.lock:
            if self.closed:  # a straggler after the end (the launcher waits 2 s for them)
                return
            if self.record is not None:
                with self.record.writing():
                    if node not in self.files:
                        self.files[node] = open(self.record.node_log(node), "ab", buffering=0)
                    self.files[node].write(raw)
                self.record.append_output(raw)
            stream = self.err if stderr else self.out
            if stream is not None:
                try:
                    stream.write(raw)
                    stream.flush()
                except (OSError, ValueError):  # our terminal is gone: the files go on
                    if stderr:
                        self.err = None
                    else:
                        self.out = None

    def close(self) -> None:
        with self.lock:
            for f in self.files.values():
                f.close()
            self.files.clear()
            self.closed = True


    def report(self, failed: list[tuple[int, int]], err: IO[str]) -> None:
        """The launcher's last lines for nodes that ended with an exit code other than 0:
        each node and its code, then the first failure as the agents decided it and where
        the full logs are."""
        for node, code in failed:
            where = (f"its log: {self.record.node_log(node)}" if self.record is not None
                     else "its output is above")
            print(f"torchjob: node {node} failed with exit code {code} ({where})", file=err)
        if failed:
            self.closings.report(str(self.record.path) if self.record is not None
                                 else "above", err)


_CLOSING = CLOSING.encode()


class Tee(io.TextIOBase):
    """The launcher's own lines: to the terminal (when there is one) and to launcher.log.
    ``tee(record, terminal)`` gives it as the ``IO[str]`` the launchers take (they only
    write and flush)."""

    def __init__(self, record: Record, terminal: IO[str] | None) -> None:
        super().__init__()
        self.terminal = terminal
        self.record = record
        self.file = open(record.launcher_log, "a", buffering=1)
        self.partial = ""  # output.log takes whole lines only

    def write(self, text: str) -> int:
        with self.record.writing():
            self.file.write(text)
        whole, newline, self.partial = (self.partial + text).rpartition("\n")
        if newline:
            self.record.append_output((whole + newline).encode())
        if self.terminal is not None:
            self.terminal.write(text)
        return len(text)

    def flush(self) -> None:
        if not self.file.closed:
            with self.record.writing():
                self.file.flush()
        if self.terminal is not None:
            self.terminal.flush()

    def close(self) -> None:
        super().close()
        with self.record.writing():
            self.file.close()


def tee(record: Record, terminal: IO[str] | None) -> IO[str]:
    return cast(IO[str], Tee(record, terminal))


# A launcher's body: the stop signals so far, whether to echo the nodes' lines, its own output.
Launch = Callable[[Stops, bool, IO[str]], int]


class LaunchedHere(runs.RecordedRuns, Backend):
    """A backend whose launcher runs on this machine (local, docker): ``run`` is the launcher
    in the foreground (Ctrl-C asks the nodes to checkpoint, a second kills them), ``submit``
    the same launcher detached; either way recorded (``BACKEND:RUN_ID``)."""

    sees_run_dir = True
    env_secrets = True

    @abc.abstractmethod
    def launch(self, request: Request, record: Record) -> Launch:
        """The launcher of ``request``, recorded in ``record``."""

    def record_data(self, request: Request) -> object:
        """What the record keeps of the request's data (JSON)."""
        return request.data

    def _start(self, request: Request, foreground: bool) -> tuple[Record, Launch]:
        spec, context = request.spec, request.context
        record = runs.create(self.name, context.run_id, Path(context.workdir) / spec.run_dir,
                             name=spec.name, foreground=foreground, request={
                                 "text": request.text, "data": self.record_data(request),
                                 "context": dataclasses.asdict(context)})
        return record, self.launch(request, record)

    def run(self, request: Request) -> int:
        record, body = self._start(request, True)
        err = tee(record, sys.stderr)
        try:
            return perform(record, lambda stops: body(stops, True, err))
        finally:
            err.close()

    def submit(self, request: Request) -> Handle:
        record, body = self._start(request, False)

        def detached(stops: Stops) -> int:
            err = tee(record, None)  # launcher.log and output.log
            try:
                return body(stops, False, err)
            finally:
                err.close()
        detach(record, detached)
        return Handle(self.name, record.path.name)

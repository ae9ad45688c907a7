"""The local launcher: performs a LocalPlan. The only module here that starts processes.

Each node (a torchrun agent), and first an elastic job's rendezvous store, runs in a session
of its own, its lines to the run's record (jobs.runs) and the terminal. A stop reaches each
agent as SIGTERM (the workers checkpoint, exit 143); a grace period later, or at a second
Ctrl-C, everything is killed, and nothing it started outlives it (docs/internals.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, NamedTuple

from torchjob.jobs.backend import GRACE_S
from torchjob.jobs.backends.local.render import LocalPlan
from torchjob.jobs.launcher import NodeOutput, Stops
from torchjob.jobs.runs import Proc, Record
from torchjob.trainer.contract import EXIT_CONFIG, EXIT_OK, EXIT_STOPPED, nodes_exit_code

_POLL = 0.1
_SCAN_EVERY = 0.5


class _Proc(NamedTuple):
    ppid: int
    pgrp: int
    start: str  # start time in clock ticks since boot: tells a reused pid apart


def _proc_table() -> dict[int, _Proc]:
    """Every live process from /proc (empty where there is no /proc)."""
    table: dict[int, _Proc] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 19 and fields[0] != b"Z":
            table[int(entry)] = _Proc(int(fields[1]), int(fields[2]), fields[19].decode())
    return table


class _Nodes:
    """The running node processes plus every descendant seen so far."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seen: set[tuple[int, str]] = set()
        self.last_scan = 0.0

    def scan(self) -> None:
        """Remember every live descendant of the nodes (pid and start time)."""
        table = _proc_table()
        family = {p.pid for p in self.procs}
        while True:
            found = {pid for pid, proc in table.items() if proc.ppid in family} - family
            if not found:
                break
            family |= found
        self.seen |= {(pid, table[pid].start) for pid in family if pid in table}
        self.last_scan = time.monotonic()

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def terminate(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL each node's process group and each live descendant (and its group)."""
        self.scan()
        table = _proc_table()
        for proc in self.procs:
            now = table.get(proc.pid)
            # A reaped node's pid may be reused: kill its group only if the pid is still ours.
            if proc.returncode is None or now is None or (proc.pid, now.start) in self.seen:
                _killpg(proc.pid)
        for pid, started in self.seen:
            now = table.get(pid)
            if now is not None and now.start == started:
                if now.pgrp == pid:  # a worker leads its own session (torchrun's doing)
                    _killpg(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(stream: IO[bytes], node: int, output: NodeOutput, stderr: bool) -> None:
    """Copy one of a node's streams line by line to its log file and the terminal. If our own
    output is gone (a closed pipe), keep draining so that the node never blocks on it."""
    for line in iter(stream.readline, b""):
        output.line(node, line, stderr=stderr)
    stream.close()


def _pump_store(stream: IO[bytes], err: IO[str]) -> None:
    for line in iter(stream.readline, b""):
        try:
            print(f"[rendezvous] {line.decode(errors='replace').rstrip()}", file=err, flush=True)
        except (OSError, ValueError):  # our terminal is gone: keep draining
            pass
    stream.close()


def _start_store(plan: LocalPlan, env: Mapping[str, str], err: IO[str]
                 ) -> tuple[subprocess.Popen[bytes], threading.Thread] | None:
    """The job's own rendezvous store, running (None: the plan has none)."""
    if plan.store is None:
        return None
    proc = subprocess.Popen(plan.store, env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    pump = threading.Thread(target=_pump_store, args=(proc.stdout, err), daemon=True)
    pump.start()
    return proc, pump


def _stop_store(store: tuple[subprocess.Popen[bytes], threading.Thread] | None) -> None:
    if store is None:
        return
    proc, pump = store
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - deaf to SIGTERM
            _killpg(proc.pid)
            proc.wait(timeout=5)
    pump.join(timeout=2)


def run_local(plan: LocalPlan, *, stops: Stops, grace: float = GRACE_S,
              record: Record | None = None, echo: bool = True,
              err: IO[str] | None = None) -> int:
    """Run every node of the plan to the end: 0 done (at least nnodes MIN nodes finished), 143
    stopped (``stops``: the stop signals so far), 1 a node failed, 2 a node could not
    start. Each node's output goes to its log in ``record`` and, with ``echo``,
    to our stdout and stderr (as the node wrote it); the nodes' processes are noted in the
    record."""
    err = err or sys.stderr
    env = {**os.environ, **plan.env}
    output = NodeOutput(record, out=sys.stdout.buffer if echo else None,
                        err=sys.stderr.buffer if echo else None)
    nodes, store = _Nodes(), None
    pumps: list[threading.Thread] = []
    try:
        if not stops.count:
            try:
                store = _start_store(plan, env, err)
            except OSError as exc:
                print(f"torchjob: cannot start the rendezvous store: {exc}", file=err)
                return EXIT_CONFIG
        if not _start_nodes(plan, env, stops, nodes, pumps, output, err):
            return EXIT_CONFIG
        if record is not None:
            with record.writing():  # the run goes on without it
                record.update(nodes=[p.__dict__ for p in map(Proc.of, nodes.pids()) if p])
        nodes.scan()
        if stops.count and not nodes.procs:
            print("torchjob: stopping: before any node started", file=err, flush=True)
        _wait(nodes, store, stops, grace, err)
    finally:
        nodes.kill()
        _stop_store(store)
        for pump in pumps:
            pump.join(timeout=2)
        output.close()
    if stops.count:
        return EXIT_STOPPED
    return _result(plan, nodes, output, err)


def _start_nodes(plan: LocalPlan, env: Mapping[str, str], stops: Stops, nodes: _Nodes,
                 pumps: list[threading.Thread], output: NodeOutput, err: IO[str]) -> bool:
    """Start each node (none after a stop), its output pumped; False (said) when one could
    not start."""
    for i, command in enumerate(plan.commands):
        if stops.count:
            break
        try:
            # node 0's workers read this command's standard input, as torchrun's do
            proc = subprocess.Popen(command, env=env, start_new_session=True,
                                    stdin=None if i == 0 else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            print(f"torchjob: cannot start node {i} ({command[0]}): {exc}", file=err)
            return False
        nodes.procs.append(proc)
        for stream, is_err in ((proc.stdout, False), (proc.stderr, True)):
            pump = threading.Thread(target=_pump, daemon=True, args=(stream, i, output, is_err))
            pump.start()
            pumps.append(pump)
    return True


def _wait(nodes: _Nodes, store: tuple[subprocess.Popen[bytes], threading.Thread] | None,
          stops: Stops, grace: float, err: IO[str]) -> None:
    """Until every node has ended: on a stop, SIGTERM to each, and after ``grace`` or a second
    stop, SIGKILL; a rendezvous store that ends early is said once."""
    deadline: float | None = None
    killed = store_gone = False
    while any(proc.poll() is None for proc in nodes.procs):
        if stops.count and deadline is None:
            print(f"torchjob: stopping: SIGTERM to {len(nodes.procs)} node(s); workers "
                  f"checkpoint and exit (up to {grace:g} s; Ctrl-C again kills now)",
                  file=err, flush=True)
            nodes.terminate()
            deadline = time.monotonic() + grace
        if deadline is not None and not killed and (stops.count > 1
                                                    or time.monotonic() > deadline):
            print("torchjob: killing every node now", file=err, flush=True)
            nodes.kill()
            killed = True
        if time.monotonic() - nodes.last_scan > _SCAN_EVERY:
            nodes.scan()
        if store is not None and store[0].poll() is not None and not store_gone:
            store_gone = True
            print(f"torchjob: the rendezvous store ended (exit {store[0].returncode}) while "
                  "nodes run: they lose their rendezvous and stop (run the job again: it "
                  "resumes from its last checkpoint)", file=err, flush=True)
        time.sleep(_POLL)


def _result(plan: LocalPlan, nodes: _Nodes, output: NodeOutput, err: IO[str]) -> int:
    """The job's exit code from its nodes'; the nodes that failed said (or, for an elastic
    job that finished without them, named)."""
    codes = [p.returncode for p in nodes.procs]
    code = nodes_exit_code(codes, plan.min_nodes)
    failed = [(i, c) for i, c in enumerate(codes) if c != 0]
    if code == EXIT_OK and failed:
        lost = ", ".join(f"node {i} (exit {c})" for i, c in failed)
        print(f"torchjob: the job finished without {lost}: an elastic job goes on while at "
              f"least nnodes MIN={plan.min_nodes} node(s) remain", file=err)
    else:
        output.report(failed, err)
    return code

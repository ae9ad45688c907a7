"""The docker launcher: runs a compose file (``jobs.backends.docker.render``) with podman-compose or
``docker compose``, streams each node's log, and always tears down (``compose down``).

A killed node container (exit 128+N but 143) is started again, up to the file's
``x-torchjob.max_restarts`` times; one that ended 1, 2 or 143 stays down. Once a node has
finished or failed for good, the others get a grace period before they are stopped. The
rules in full, and what a stop does: docs/internals.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml
from torchjob.jobs.backends.docker import reaper
from torchjob.jobs.backends.docker.engine import PROJECT_LABEL, Engine, down
from torchjob.jobs.backends.docker.render import (HOST_DIR_VAR, RESTARTS, RUN_ID_VAR,
                                                  mounts_workdir, service_name)
from torchjob.jobs.images import ensure_image, prepare_dirs
# the run loop's one way to call the engine (the tests replace it)
from torchjob.jobs.images import run_captured as _run
from torchjob.jobs.launcher import NodeOutput, Stops
from torchjob.jobs.runs import Record
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import IMAGE_UID, UserError
from torchjob.trainer.contract import (EXIT_CONFIG, EXIT_OK, EXIT_STOPPED, EXIT_STORE_LOST,
                                       nodes_exit_code, signal_of)
from torchjob.trainer.runlock import clear as clear_lock

SERVICE_LABEL = "com.docker.compose.service"
FINISH_GRACE_S = 60.0  # once a node finished training or failed, the others' time to end too
_POLL_S = 1.0  # how often the run loop wakes: a stop is heard within it
# how often it asks the engine when no node's log ended meanwhile (an exit ends its log
# stream, which wakes the loop at once): each ask is an inspect, ~0.1 s of CPU
_LOOK_S = 5.0


def readable(cwd: Path) -> None:
    """The working directory, mounted at the image's, must be readable by the image's user:
    a UserError that says how otherwise (not for a user whose uid is the image's)."""
    info = cwd.stat()
    if info.st_uid == IMAGE_UID or info.st_mode & 0o005 == 0o005 or os.getuid() == IMAGE_UID \
            or os.getuid() != 0:  # not root: the containers run as the caller (invoking_user)
        return
    raise UserError(f"the job runs your code from {cwd}, mounted in the containers, but the "
                    f"image's user (uid {IMAGE_UID}) cannot read it (mode "
                    f"{info.st_mode & 0o777:o}): chmod o+rx {cwd}, or build your code into the "
                    f"image and set docker.mount_workdir: false")


@dataclass
class _Node:
    name: str
    cid: str
    status: str = "created"
    code: int = 0
    restarts: int = 0
    exited_at: float | None = None
    printed: int = 0
    pump: threading.Thread | None = None


@dataclass
class _Run:
    engine: Engine
    project: str
    file: Path
    max_restarts: int  # starts of one node's container after it was killed
    stops: Stops
    nodes: list[_Node] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)  # a node's log stream

    def ids(self) -> list[str]:
        return [node.cid for node in self.nodes]

    def refresh(self) -> None:
        """Status and exit code of every node (one inspect call)."""
        proc = _run([self.engine.name, "inspect", "--format",
                     "{{.State.Status}} {{.State.ExitCode}}", *self.ids()], timeout=60)
        lines = proc.stdout.split("\n")
        now = time.monotonic()
        for node, line in zip(self.nodes, lines):
            words = line.split()
            if len(words) != 2:
                continue
            node.status, node.code = words[0], int(words[1])
            if node.status in ("running", "restarting"):
                node.exited_at = None
            elif node.status in ("exited", "stopped", "dead") and node.exited_at is None:
                node.exited_at = now

    def finished(self) -> bool:
        """A node ended its training (exit 0): the job is done or ending."""
        return any(node.code == 0 and node.exited_at is not None for node in self.nodes)

    def failed(self) -> _Node | None:
        """A node that ended the job for good: it failed (1), was misconfigured (2) or ended
        with another code below 128, none of which is restarted."""
        return next((node for node in self.nodes if node.exited_at is not None
                     and 0 < node.code < 128), None)

    def ending(self) -> str:
        """Why the job is ending though nodes still run ("" while it is not)."""
        if self.finished():
            return "training finished"
        if failed := self.failed():
            return f"{failed.name} failed (exit {failed.code}): the job failed"
        return ""

    def restartable(self, node: _Node) -> bool:
        """The node ended killed (not failed, misconfigured or stopped), it has restarts left,
        nobody asked the run to stop, no node has finished the training and none failed."""
        return (node.exited_at is not None and killed(node.code) and not self.stops.count
                and node.restarts < self.max_restarts and not self.ending())

    def restart(self, node: _Node, err: IO[str]) -> None:
        node.restarts += 1
        print(f"torchjob: {node.name} was killed (exit {node.code}): starting it again "
              f"(restart {node.restarts} of {self.max_restarts})", file=err, flush=True)
        started = _run([self.engine.name, "start", node.cid], timeout=120)
        if started.returncode != 0:
            print(f"torchjob: {node.name} could not be started again: "
                  f"{started.stderr.strip()}", file=err, flush=True)
            return
        node.status, node.exited_at = "running", None


def killed(code: int) -> bool:
    """A container's exit code that says its first process died of a signal other than
    SIGTERM (a stop: the agent then checkpointed and exited 143 itself). Not
    ``EXIT_STORE_LOST``: the store's service is not started again here (``restart: no``), so a
    node started again could not meet the others; the job ends with that code (run it again:
    it resumes from the last checkpoint), as a local run does."""
    return signal_of(code) is not None and code not in (EXIT_STOPPED, EXIT_STORE_LOST)


def _follow(run: _Run, index: int, node: _Node, output: NodeOutput) -> None:
    """Pass on the node's log (worker lines carry the log prefix; the agent's own get
    ``[node I] ``) across restarts: the engine keeps a container's log over its restarts, so
    lines already passed on are skipped."""
    while True:
        follow = [] if run.done.is_set() else ["-f"]
        seen_restarts = node.restarts
        try:
            proc = subprocess.Popen([run.engine.name, "logs", *follow, node.cid],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return
        assert proc.stdout is not None
        count = 0
        for line in iter(proc.stdout.readline, b""):
            count += 1
            if count > node.printed:
                node.printed = count
                output.line(index, line)
        proc.wait()
        run.ended.set()  # its container exited (or the engine ended the stream): look now
        if not follow:
            return
        while not run.done.is_set() and not (node.status == "running"
                                             and node.restarts != seen_restarts):
            time.sleep(0.2)


def _containers(run: _Run, nnodes: int) -> list[_Node]:
    nodes = []
    for i in range(nnodes):
        name = service_name(i)
        proc = _run([run.engine.name, "ps", "-a", "-q", "--filter",
                     f"label={PROJECT_LABEL}={run.project}", "--filter",
                     f"label={SERVICE_LABEL}={name}"], timeout=60)
        ids = proc.stdout.split()
        if ids:
            nodes.append(_Node(name, ids[0]))
    return nodes


def result(spec: JobSpec, nodes: list[_Node], signalled: bool) -> int:
    """0 when at least nnodes MIN nodes finished the training; else the trainer's codes."""
    if signalled:
        return EXIT_STOPPED
    return nodes_exit_code([node.code for node in nodes if node.status != "created"],
                           spec.nnodes.min)


def run_docker(spec: JobSpec, *, engine: Engine, grace: float, stops: Stops, cwd: Path,
               compose: str, project: str, record: Record, echo: bool = True,
               err: IO[str] | None = None) -> int:
    """Run the compose file ``compose`` (the backend's rendered request) for ``cwd`` as one
    container per node to the end; the exit code as for local runs (``stops``: the stop
    signals so far). The file is kept in the ``record``, the compose project is named
    ``project``, and each node's log goes to the record and, with ``echo``, to our stdout."""
    err = err or sys.stderr
    if mounts_workdir(spec):
        readable(cwd)
    ensure_image(engine.name, spec.image, err)
    run_dir = prepare_dirs(spec, cwd)
    file = record.path / "compose.yaml"
    file.write_text(compose)
    run = _Run(engine, project, file,
               int(yaml.safe_load(compose).get(RESTARTS, {}).get("max_restarts", 0)), stops)
    output = NodeOutput(record, out=sys.stdout.buffer if echo else None, err=None)
    print(f"torchjob: {spec.name}: {spec.nnodes.max} node container(s) x "
          f"{spec.procs_text} with {engine.name}, project {run.project}, "
          f"compose file {file}", file=err, flush=True)
    watcher = reaper.watch(engine, project, file, grace, run_dir, record.path / "reaper.log")
    try:
        if stops.count:
            print("torchjob: stopping: before any container started", file=err, flush=True)
            return EXIT_STOPPED
        if not _up(run, spec, cwd, err):
            return EXIT_CONFIG
        with record.writing():  # the run goes on without it
            record.update(containers=[node.cid for node in run.nodes])
        for index, node in enumerate(run.nodes):
            node.pump = threading.Thread(target=_follow, args=(run, index, node, output),
                                         daemon=True)
            node.pump.start()
        _wait(run, spec, grace, err)
    finally:
        _tear_down(run, output, run_dir)
        reaper.release(watcher)  # ended here: its watch has nothing to do
    code = result(spec, run.nodes, stops.count > 0)
    if code not in (EXIT_OK, EXIT_STOPPED):
        output.report([(i, node.code) for i, node in enumerate(run.nodes) if node.code], err)
    return code


def _up(run: _Run, spec: JobSpec, cwd: Path, err: IO[str]) -> bool:
    """``compose up``: every node's container created and started; False (said) otherwise."""
    up = _run(run.engine.compose_argv(run.project, run.file, "up", "-d"), timeout=600,
              env={**os.environ, HOST_DIR_VAR: str(cwd.resolve()), RUN_ID_VAR: run.project})
    run.nodes = _containers(run, spec.nnodes.max)
    if up.returncode != 0 or len(run.nodes) != spec.nnodes.max:
        tail = "\n".join((up.stdout + up.stderr).splitlines()[-20:])
        print(f"torchjob: compose up failed (exit {up.returncode}):\n{tail}", file=err)
        return False
    # podman-compose 1.0 ends 0 when a container could not be started (its command not in the
    # image, a mount refused): one left created is started here, and its error said
    run.refresh()
    for node in run.nodes:
        if node.status not in ("created", "configured"):
            continue
        started = _run([run.engine.name, "start", node.cid], timeout=120)
        if started.returncode != 0:
            why = (started.stderr.strip() or started.stdout.strip()).splitlines()
            print(f"torchjob: {node.name}'s container could not start: "
                  f"{why[-1] if why else f'{run.engine.name} start exit {started.returncode}'}"
                  f" (image {spec.image})", file=err, flush=True)
            return False
    return True


def _tear_down(run: _Run, output: NodeOutput, run_dir: Path) -> None:
    """Kill what runs, pass on the last log lines, remove the containers and the network."""
    run.done.set()
    if run.nodes:
        _run([run.engine.name, "kill", *run.ids()], timeout=60)
        for node in run.nodes:
            if node.pump is not None:
                node.pump.join(timeout=30)
    output.close()
    down(run.engine, run.project, run.file)
    # no agent of this run is left: a node killed (or stopped after the grace) could not
    # release the run directory's lock, and the next run there would be refused for a while.
    # Its agents locked with the rendezvous id, which is this project's name (RUN_ID_VAR).
    clear_lock(run_dir, run.project)


def _wait(run: _Run, spec: JobSpec, grace: float, err: IO[str]) -> None:
    """Poll the nodes until the job has ended; on a signal stop them, on a second kill them."""
    stopper: subprocess.Popen[bytes] | None = None
    killed = False
    finished_at: float | None = None
    why = ""
    looked = hurry = float("-inf")
    while True:
        if run.ended.is_set():  # a node's log ended: its exit may reach inspect a moment later
            run.ended.clear()
            hurry = time.monotonic() + _LOOK_S
        now = time.monotonic()
        if now < hurry or now - looked >= _LOOK_S or run.stops.count or finished_at is not None:
            looked = now
            run.refresh()
        for node in run.nodes:
            if run.restartable(node):
                run.restart(node, err)
        if all(node.exited_at is not None for node in run.nodes):
            return
        if run.stops.count and stopper is None:
            print(f"torchjob: stopping: SIGTERM to {len(run.nodes)} container(s); workers "
                  f"checkpoint and exit (up to {grace:g} s; Ctrl-C again kills now)",
                  file=err, flush=True)
            stopper = subprocess.Popen([run.engine.name, "stop", "-t", str(int(grace)),
                                        *run.ids()], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        if run.stops.count > 1 and not killed:
            print("torchjob: killing every container now", file=err, flush=True)
            _run([run.engine.name, "kill", *run.ids()], timeout=60)
            killed = True
        if finished_at is None and (why := run.ending()):
            finished_at = time.monotonic()
        if finished_at is not None and time.monotonic() - finished_at > FINISH_GRACE_S:
            print(f"torchjob: {why}; stopping the node(s) still running after "
                  f"{FINISH_GRACE_S:g} s", file=err, flush=True)
            _run([run.engine.name, "stop", "-t", "10", *run.ids()], timeout=120)
            run.refresh()
            return
        run.ended.wait(_POLL_S)

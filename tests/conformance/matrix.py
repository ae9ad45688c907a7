"""The conformance matrix (DESIGN.md, "One behaviour everywhere"): scenarios x backends, every
cell a real run of what users run, ``torchjob run --to BACKEND JOB.yaml --set ...``.

A column is one entry of ``COLUMNS``: a backend's name, how a user stops a run there and how
a worker dies there (in a container: by the pid and host name the worker wrote at the gate).
Kubernetes has no API server here: its column runs the PyTorchJob ``torchjob run --to k8s``
would submit on the pod emulator (``tests/k8s/pods.py``), each pod a podman container. A cell that cannot pass is declared in ``DECLARED``, the one place that
says why: ``n/a`` (the backend cannot do it: not run), ``pending`` (waits for work not merged
yet: not run) or ``gap`` (the backend breaks the contract there: the cell runs and must still
fail, so that the declaration goes once the gap is fixed). Nothing is skipped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from tests.conformance.containers import (CONFORMANCE_DOCKER_HOST, PODS, RUN_CLAIM,
                                           TASK_CLAIM, docker_cleanup, docker_kill,
                                           docker_pause, pod_cleanup, pod_kill, pod_pause,
                                           task_sets, torchx_cleanup, torchx_kill, torchx_pause)
from tests.procs import PYTHON, ROOT, TORCHJOB, env_for_tests, torchjob
from tests.recorded import wait_until

# one `torchjob run` of a few steps on a shared 2-core machine: with 8 columns at once beside
# the other pytest worker, a pod-contract cell once took 400 s, all of it slow, none stuck
RUN_TIMEOUT_S = 600.0
EVENT_TIMEOUT_S = 240.0  # from a run's start to an event in it (a gate reached, a stop seen)
# "torchjob: submitted slurm:12", the line Backend.run writes on every backend that submits
HANDLE = re.compile(r"^(?:torchjob: submitted )?((?:local|docker|slurm|torchx|k8s):\S+)$", re.M)


@dataclass
class Run:
    """One ``torchjob run`` in the background, its stdout and stderr together in ``log``."""

    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def handle(self) -> str:
        """The job's handle, as the run printed it."""
        found = wait_until(lambda: HANDLE.search(self.text()) or self.proc.poll() is not None,
                           EVENT_TIMEOUT_S, "the run to print its job's handle", self.tail)
        if not isinstance(found, re.Match):
            raise AssertionError(f"the run ended without printing a handle:\n{self.tail()}")
        return found[1]

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"torchjob run still running after {RUN_TIMEOUT_S:g} s:\n"
                                 f"{self.tail()}") from None

    def close(self) -> None:
        """Stop it if it still runs: a Ctrl-C (every backend's run stops its job on one),
        then a kill."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass(frozen=True)
class Worker:
    """A worker held at the gate: its pid and host name, as it saw them (in a container:
    the container's pid namespace and host name)."""

    pid: int
    host: str

    @classmethod
    def parse(cls, text: str) -> Worker:
        pid, host = text.split()
        return cls(int(pid), host)


Stop = Callable[["Cell", Run], None]
Kill = Callable[["Cell", Worker], None]


def send(sig: signal.Signals) -> Stop:
    """Stop by a signal to the ``torchjob run`` process (Ctrl-C is SIGINT)."""
    def stop(cell: Cell, run: Run) -> None:
        run.proc.send_signal(sig)
    return stop


def cancel(cell: Cell, run: Run) -> None:
    """Stop with ``torchjob cancel HANDLE`` from another terminal."""
    done = torchjob("cancel", run.handle(), cwd=cell.workdir, env=cell.env())
    assert done.returncode == 0, done.stdout + done.stderr


def kill_pid(cell: Cell, worker: Worker) -> None:
    """kill -9 of the worker, by the pid it wrote at the gate (on this host)."""
    os.kill(worker.pid, signal.SIGKILL)


def pause_pid(cell: Cell, worker: Worker) -> None:
    """SIGSTOP of the worker, by the pid it wrote at the gate (on this host): a hang."""
    os.kill(worker.pid, signal.SIGSTOP)


def scancel(cell: Cell, run: Run) -> None:
    """A Slurm job of the cell still queued after its run ended: cancelled (ours only)."""
    job_id = re.split(r"[:/]", run.handle())[-1] if HANDLE.search(run.text()) else ""
    if job_id.isdigit():
        subprocess.run(["scancel", job_id], env=env_for_tests(), capture_output=True,
                       check=False)


def nothing(cell: Cell, run: Run) -> None:
    return None


@dataclass(frozen=True)
class Column:
    """One backend of the matrix."""

    backend: str  # what --to says
    stop: Stop  # how a user stops a run there: the workers checkpoint, the run exits 143
    kill: Kill = kill_pid  # kill -9 of one worker
    pause: Kill = pause_pid  # SIGSTOP of one worker (a hang)
    sets: tuple[str, ...] = ()  # --set words this backend needs (e.g. a mount)
    needs: tuple[str, ...] = ()  # pytest fixtures that bring its engine up
    marks: tuple[str, ...] = ()  # pytest markers of its cells
    cwd: str | None = None  # the workers' working directory, if not where torchjob runs
    env: tuple[tuple[str, str], ...] = ()  # the user's environment for it (a venv activated)
    cleanup: Stop = nothing  # after a cell: leave nothing of it queued or running
    command: tuple[str, ...] = ()  # what runs the job, if not `torchjob run --to BACKEND`

    def argv(self) -> list[str]:
        return list(self.command or (*TORCHJOB, "run", "--to", self.backend))


# The venv activated: TorchX runs `python` on the nodes, not this interpreter (README, TorchX)
VENV = (("PATH", os.pathsep.join([str(Path(PYTHON).parent), os.environ.get("PATH", "")])),)


def on_slurm(backend: str, env: tuple[tuple[str, str], ...] = ()) -> Column:
    """A column on the dev cluster (tests/slurm/conftest.py): stopped with torchjob cancel."""
    return Column(backend, stop=cancel, needs=("slurm_cluster",), marks=("slurm",),
                  cleanup=scancel, env=env)


COLUMNS = (
    Column("local", stop=send(signal.SIGTERM)),
    Column("torchx:local_cwd", stop=send(signal.SIGINT)),
    on_slurm("slurm"),
    on_slurm("slurm:sbatch"),
    on_slurm("torchx:slurm", env=VENV),
    # a user's code (a script) runs from the working directory, mounted at the image's
    Column("docker", stop=send(signal.SIGINT), kill=docker_kill, pause=docker_pause,
           sets=task_sets(ROOT / "tests"),
           needs=("container_image",), marks=("containers",), cwd="/workspace",
           cleanup=docker_cleanup),
    # TorchX's containers: the run directory mounted from the cell's, as docker; a script is
    # built into an image of the cell's directory
    Column("torchx:local_docker", stop=send(signal.SIGINT), kill=torchx_kill,
           pause=torchx_pause, sets=task_sets(ROOT / "tests"),
           needs=("container_image", "conformance_docker_api"), marks=("containers",),
           cwd="/workspace", env=(("DOCKER_HOST", CONFORMANCE_DOCKER_HOST),),
           cleanup=torchx_cleanup),
    # the run directory is a PVC mounted at the image's working directory: relative paths
    # (run_dir, a script) are on it, as on the host for the other columns
    Column("k8s (pod contract)", stop=send(signal.SIGTERM), kill=pod_kill, pause=pod_pause,
           sets=(f"k8s.pvc={RUN_CLAIM}", "k8s.pvc_mount_path=/workspace",
                 *task_sets(TASK_CLAIM)),
           needs=("container_image",), marks=("containers",), cwd="/workspace",
           cleanup=pod_cleanup, command=PODS),
)


@dataclass(frozen=True)
class Outcome:
    """What became of a cell: "pass", "fail", or its declared kind when it was not run."""

    status: str
    seconds: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class Declared:
    kind: Literal["n/a", "pending", "gap"]
    why: str
    fails_with: str = ""  # a gap: what its cell's failure says (so it fails for that reason)


DECLARED: dict[tuple[str, str], Declared] = {}


def cell_dir(root: Path, backend: str, scenario: str) -> Path:
    """Where a cell runs: its own directory under the matrix's ``root``."""
    return root / re.sub(r"[^a-z0-9.]+", "-", f"{backend}-{scenario}")


@dataclass
class Cell:
    """One scenario on one backend, in a directory of its own (the cwd of its runs)."""

    scenario: str
    column: Column
    workdir: Path
    reference: Callable[[], dict]  # final parameters of the uninterrupted run (torchrun)
    runs: list[Run] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.workdir / "runs" / "job"

    def sibling(self, scenario: str) -> Path:
        """The directory of the same backend's cell of ``scenario`` (run before this one when
        it comes first in SCENARIOS and was selected)."""
        return cell_dir(self.workdir.parent, self.column.backend, scenario)

    @property
    def gate(self) -> Path:
        return self.workdir / "runs" / "gate"

    def start(self, job: str | Path, *sets: str, options: tuple[str, ...] = ()) -> Run:
        """``torchjob run --to BACKEND [OPTIONS] JOB --set ...`` in the background."""
        # no rdzv.port: each backend's own choice, as users run it (a free one here, the job
        # id's on Slurm, 29400 in a container's own network)
        words = ["run_dir=runs/job", *self.column.sets, *sets]
        argv = [*self.column.argv(), *options, str(job),
                *[w for s in words for w in ("--set", s)]]
        # the workers write the gate, whatever user they run as (the image's is uid 1000)
        self.gate.mkdir(parents=True, exist_ok=True)
        self.gate.chmod(0o777)
        log = self.workdir / f"run-{len(self.runs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=self.workdir, env=self.env(), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.runs.append(Run(proc, log))
        return self.runs[-1]

    def run(self, job: str | Path, *sets: str, options: tuple[str, ...] = ()) -> tuple[int, str]:
        """The same to its end: (exit code, output)."""
        run = self.start(job, *sets, options=options)
        return run.wait(), run.text()

    def env(self) -> dict[str, str]:
        return env_for_tests(**dict(self.column.env))

    def at_gate(self, run: Run, ranks: int = 2) -> dict[int, Worker]:
        """Every rank held at the gate (tests/conformance/gate.py): rank -> its worker."""
        def held() -> dict[int, Worker] | bool:
            if run.proc.poll() is not None:
                raise AssertionError(f"the run ended before its gate:\n{run.tail()}")
            found = {int(p.name[3:]): Worker.parse(p.read_text())
                     for p in self.gate.glob("at-*")}
            return len(found) == ranks and found
        workers: dict[int, Worker] = wait_until(held, EVENT_TIMEOUT_S,
                                                f"{ranks} ranks at the gate", run.tail)
        return workers

    def open_gate(self) -> None:
        self.gate.mkdir(parents=True, exist_ok=True)
        (self.gate / "go").touch()

    def close(self) -> None:
        """Every run stopped and cleaned up; what one left behind is raised at the end."""
        left = []
        for run in self.runs:
            run.close()
            try:
                self.column.cleanup(self, run)
            except AssertionError as exc:
                left.append(str(exc))
        assert not left, "; ".join(left)

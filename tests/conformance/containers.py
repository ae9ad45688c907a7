"""The conformance matrix's container columns: docker (compose on podman), TorchX's
local_docker (through podman's Docker API) and the Kubernetes pod contract
(``tests/k8s/pods.py``). How a worker held at the gate is killed inside its
container, and how a cell checks that its run left no container or network behind."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from tests.k8s.pods import ANNOUNCE_RE, JOB_LABEL, POD_LABEL, leftovers
from tests.procs import PYTHON, ROOT

if TYPE_CHECKING:  # matrix.py imports this module for its COLUMNS
    from tests.conformance.matrix import Cell, Run, Worker


def kill_in(container: str, worker: Worker, sig: int = 9) -> None:
    """kill -SIG (9 unless told) of the worker inside its container (the image has no
    kill(1): python's)."""
    done = subprocess.run(["podman", "exec", container, "python", "-c",
                           "import os, sys; os.kill(int(sys.argv[1]), int(sys.argv[2]))",
                           str(worker.pid), str(sig)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"kill -{sig} of {worker} in {container}: {done.stderr}"


def podman_ids(*filters: str, what: str = "ps") -> list[str]:
    argv = ["podman", "ps", "-a"] if what == "ps" else ["podman", "network", "ls"]
    found = subprocess.run([*argv, "-q", *[w for f in filters for w in ("--filter", f)]],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return found.stdout.split()


# The docker launcher's first line names its compose project (jobs/backends/docker/containers.py)
PROJECT = re.compile(r"project (\S+), compose file")
COMPOSE_LABEL = "com.docker.compose.project"  # on the containers
NETWORK_LABEL = "io.podman.compose.project"  # on podman-compose's network


def announced(pattern: re.Pattern[str], run: Run) -> str | None:
    found = pattern.search(run.text())
    return found[1] if found else None


def docker_kill(cell: Cell, worker: Worker, sig: int = 9) -> None:
    """kill -9 (or ``sig``) of the worker in its node container (service = host name)."""
    project = announced(PROJECT, cell.runs[-1])
    ids = podman_ids(f"label={COMPOSE_LABEL}={project}",
                     f"label=com.docker.compose.service={worker.host}")
    assert len(ids) == 1, f"no one container of {project} for {worker}: {ids}"
    kill_in(ids[0], worker, sig)


def docker_pause(cell: Cell, worker: Worker) -> None:
    """SIGSTOP of the worker in its node container: a hang."""
    docker_kill(cell, worker, int(signal.SIGSTOP))


def docker_cleanup(cell: Cell, run: Run) -> None:
    """Nothing of the run's compose project left (compose down removed it all)."""
    project = announced(PROJECT, run)
    if project is None:
        return
    containers = podman_ids(f"label={COMPOSE_LABEL}={project}")
    networks = podman_ids(f"label={NETWORK_LABEL}={project}", what="network")
    if containers or networks:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *containers], capture_output=True,
                       timeout=120, check=False)
        subprocess.run(["podman", "network", "rm", "-f", *networks], capture_output=True,
                       timeout=120, check=False)
        raise AssertionError(f"{project} left containers {containers}, networks {networks}")


def pod_kill(cell: Cell, worker: Worker, sig: int = 9) -> None:
    """kill -9 (or ``sig``) of the worker in its pod (the pod's name is its host name)."""
    token = announced(ANNOUNCE_RE, cell.runs[-1])
    ids = podman_ids(f"label={JOB_LABEL}={token}", f"label={POD_LABEL}={worker.host}",
                     "status=running")
    assert len(ids) == 1, f"no one running pod {worker.host} of {token}: {ids}"
    kill_in(ids[0], worker, sig)


def pod_pause(cell: Cell, worker: Worker) -> None:
    """SIGSTOP of the worker in its pod: a hang."""
    pod_kill(cell, worker, int(signal.SIGSTOP))


def pod_cleanup(cell: Cell, run: Run) -> None:
    """Nothing of the emulated job left (the runner removes its containers and network)."""
    token = announced(ANNOUNCE_RE, run)
    if token is not None and (left := leftovers(token)):
        subprocess.run(["podman", "rm", "-f", "-t", "0", *left], capture_output=True,
                       timeout=120, check=False)
        subprocess.run(["podman", "network", "rm", "-f", token], capture_output=True,
                       timeout=120, check=False)
        raise AssertionError(f"pods of {token} left behind: {left}")


# TorchX's local_docker talks to the Docker API: the matrix's own podman service on a socket
# of its own (tests/conformance/conftest.py), which no other test stops or replaces
CONFORMANCE_DOCKER_HOST = "unix:///run/torchjob-conformance-podman.sock"
TORCHX_APP = re.compile(r"torchx:local_docker://[^/\s]*/([\w-]+)")
TORCHX_APP_LABEL = "torchx.pytorch.org/app-id"


def torchx_kill(cell: Cell, worker: Worker, sig: int = 9) -> None:
    """kill -9 (or ``sig``) of the worker in its container: TorchX names each container as
    its host name."""
    kill_in(worker.host, worker, sig)


def torchx_pause(cell: Cell, worker: Worker) -> None:
    """SIGSTOP of the worker in its container: a hang."""
    torchx_kill(cell, worker, int(signal.SIGSTOP))


def torchx_cleanup(cell: Cell, run: Run) -> None:
    """The app's containers removed (TorchX keeps them, ended, for its logs); none may still
    run once its ``torchjob run`` ended."""
    app = announced(TORCHX_APP, run)
    if app is None:
        return
    running = podman_ids(f"label={TORCHX_APP_LABEL}={app}", "status=running")
    ids = podman_ids(f"label={TORCHX_APP_LABEL}={app}")
    if ids:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True,
                       timeout=120, check=False)
    if running:
        raise AssertionError(f"{app} left running containers {running}")


# The gate's task (tests.conformance.gate) reaches containers as a user's task does: a
# mount and PYTHONPATH (a host path for docker, a PersistentVolumeClaim on Kubernetes)
TASK_MOUNT = "/opt/conformance"
TASK_CLAIM = "conformance-tests"
RUN_CLAIM = "cell"  # the pods' shared run directory: the cell's directory, as a RWX PVC


def task_sets(source: str | Path) -> tuple[str, ...]:
    return (f"mounts=[{{source: '{source}', target: '{TASK_MOUNT}/tests', read_only: true}}]",
            f"env.PYTHONPATH={TASK_MOUNT}")


# `torchjob run --to k8s` against the pod emulator (tests/k8s/pods_run.py): the manifest that
# command submits, its pods run in podman as the operator would run them
PODS = (PYTHON, "-m", "tests.k8s.pods_run", "--claim", f"{RUN_CLAIM}=.",
        "--claim", f"{TASK_CLAIM}={ROOT / 'tests'}")


"""A TorchX scheduler that lacks what it needs here (its packages, its cluster's commands, a
Docker API, a kubeconfig, a cluster that answers) ends `torchjob` with one line that names the
missing piece and the fix, exit 2, before anything is submitted: TorchX itself raised from deep
inside (a traceback, exit 1). Every case is this machine as it is, or an environment variable
pointed at nothing."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from tests.procs import env_for_tests, torchjob

DEFAULT = "jobs/examples/default.yaml"


def said(proc: object, *parts: str) -> str:
    """The one line ``torchjob`` ended with, checked: exit 2, no traceback, every part in it."""
    rc, err = getattr(proc, "returncode"), getattr(proc, "stderr")
    assert rc == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("torchjob: ") and all(part in line for part in parts), err
    return line


def refused_port() -> int:
    """A port of this machine where nothing listens (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_local_docker_without_a_docker_api_names_the_socket_and_podman(tmp_path: Path) -> None:
    socket_path = tmp_path / "docker.sock"
    env = {**env_for_tests(), "DOCKER_HOST": f"unix://{socket_path}"}
    for argv in (["run", "--to", "torchx:local_docker", DEFAULT],
                 ["submit", "--to", "torchx:local_docker", DEFAULT],
                 ["status", "torchx:local_docker://torchx/digits-x1"]):
        said(torchjob(*argv, env=env), f"none answers at unix://{socket_path}",
             "podman system service", "--to docker")


def test_kubernetes_without_a_kubeconfig_says_set_kubeconfig(tmp_path: Path) -> None:
    env = {**env_for_tests(), "KUBECONFIG": str(tmp_path / "nothing")}
    for to in ("torchx:kubernetes", "torchx:kubernetes_mcad"):
        said(torchjob("run", "--to", to, DEFAULT, env=env),
             f"scheduler finds no cluster in {tmp_path / 'nothing'}", "set KUBECONFIG")
        rendered = torchjob("render", "--to", to, DEFAULT, env=env)  # needs no cluster
        assert rendered.returncode == 0, rendered.stderr
    for argv in (["list", "--to", "torchx:kubernetes"],
                 ["logs", "torchx:kubernetes://torchx/default:digits-x1"]):
        said(torchjob(*argv, env=env), "finds no cluster", "set KUBECONFIG")


def test_kubernetes_whose_server_refuses_names_the_call_and_the_error(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{refused_port()}"}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: default}}}}]
current-context: x
users: [{{name: u, user: {{token: t}}}}]
""")
    env = {**env_for_tests(), "KUBECONFIG": str(config)}
    said(torchjob("run", "--to", "torchx:kubernetes", DEFAULT, env=env),
         "TorchX's kubernetes scheduler failed to submit the job:", "Connection refused")
    said(torchjob("list", "--to", "torchx:kubernetes", env=env),
         "failed to list its jobs:", "Connection refused")


def test_schedulers_without_their_packages_or_commands_name_them() -> None:
    assert importlib.util.find_spec("ray") is None  # not in torchjob's [test] extra
    assert shutil.which("bhosts") is None  # no LSF here
    said(torchjob("render", "--to", "torchx:ray", DEFAULT),
         "TorchX's ray scheduler needs Python package(s) not installed here: pip install "
         "'ray[default]'")
    said(torchjob("run", "--to", "torchx:lsf", DEFAULT),
         "TorchX's lsf scheduler runs the cluster's commands (bhosts, bsub, bjobs, bkill), and "
         "this machine has no bhosts on PATH")
    # validate: the spec is valid; its rendering for that scheduler could not be checked
    out = torchjob("validate", "--to", "torchx:ray", DEFAULT)
    assert out.returncode == 2 and "pip install 'ray[default]'" in out.stderr, out.stderr
    assert out.stdout == f"{DEFAULT}: a valid job spec, not checked against torchx:ray, which " \
        "cannot render it here (above)\n", out.stdout


def test_slurm_without_its_commands_on_path_names_them() -> None:
    env = {**env_for_tests(), "PATH": str(Path(sys.executable).parent)}
    assert shutil.which("sbatch", path=env["PATH"]) is None
    for argv in (["list", "--to", "torchx:slurm"], ["cancel", "torchx:slurm://torchx/12"]):
        said(torchjob(*argv, env=env), "TorchX's slurm scheduler runs the cluster's commands "
             "(sbatch, sacct, scancel), and this machine has no sbatch on PATH")


@pytest.mark.parametrize("handle, message", [
    ("torchx:kubernetes://default:digits-x1", "is not a TorchX app handle: write "
     "SCHEDULER://SESSION/APP_ID"),
    ("torchx:nope://torchx/x", "unknown TorchX scheduler 'nope'; choose from"),
])
def test_a_handle_torchx_cannot_read_exits_2(handle: str, message: str) -> None:
    said(torchjob("status", handle, env={**env_for_tests(), "KUBECONFIG": os.devnull}),
         message)

"""The TorchX component: TorchX's own linter, its help, and a real local_cwd run that ends
where `torchjob run` of the same job ends, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torchx.specs.file_linter import validate

from torchjob.jobs.backends.torchx.components import train
from torchjob.jobs.values import SpecError
from tests.procs import torchjob

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = f"{ROOT}/jobs/backends/torchx/components.py:train"


def torchx_env() -> dict[str, str]:
    """As in an activated venv: `torchx` and the `python` its bash -c runs are the venv's."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_torchx_linter_accepts_the_component() -> None:
    assert validate(str(ROOT / "jobs/backends/torchx/components.py"), "train") == []


def test_help_shows_every_option() -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "torchx"), "run", "-s", "local_cwd",
                          COMPONENT, "--help"], capture_output=True, text=True, timeout=60,
                         env=torchx_env()).stdout
    for option in ("-j", "-m", "--script", "--image", "--name", "--cpu", "--gpu", "--memMB", "-h",
                   "--env", "--mounts", "--max_retries", "--max_restarts", "--rdzv_port"):
        assert f"{option} " in out, option


def test_appdef_shape() -> None:
    app = train("--epochs", "3", j="1:2x2", env={"A": "b"},
                mounts=["type=bind", "src=/data", "dst=/data", "readonly"])
    role = app.roles[0]
    assert (role.min_replicas, role.num_replicas) == (1, 2)
    assert role.mounts[0].read_only
    script = role.args[1]
    # the user's env as words of the script, quoted against the kubelet's $(VAR) expansion
    assert script.startswith("env A=b python ") and "A" not in role.env
    assert "-m torchjob.trainer.agent --run-dir runs/torchjob " \
        "--checkpoint-dir runs/torchjob/checkpoints " \
        "--hang-timeout 180 " \
        "--nnodes 1:2 --nproc-per-node 2" in script
    assert "--rdzv-endpoint $${${rank0_env}:=localhost}:29400" in script
    assert script.endswith("--epochs 3")


@pytest.mark.parametrize("kwargs, message", [
    ({"j": "2"}, "MIN:]MAXxNPROC"), ({"j": "3:2x2"}, "MIN must be <= MAX"),
    ({"name": "Bad Name"}, "name"), ({"cpu": -1}, "cpu"),
])
def test_bad_arguments_say_what_is_wrong(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, SpecError), match=message):
        train(**kwargs)


@pytest.mark.integration
def test_local_cwd_trains_like_torchjob_run(tmp_path: Path) -> None:
    import torch
    torchx = subprocess.run([str(Path(sys.executable).parent / "torchx"), "run", "-s",
                             "local_cwd", COMPONENT, "-j", "1x2", "--name", "tx", "--",
                             "--epochs", "4", "--progress", "lines"],
                            cwd=tmp_path, env=torchx_env(), capture_output=True, text=True,
                            timeout=600)
    assert torchx.returncode == 0, torchx.stderr[-3000:]
    assert "SUCCEEDED" in torchx.stderr + torchx.stdout
    local = torchjob("run", str(ROOT / "jobs/examples/default.yaml"), "--set",
                     f"run_dir={tmp_path}/local", "--set", "trainer.args.epochs=4",
                     env=torchx_env(), timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]

    def final(run: Path) -> dict:
        newest = sorted((run / "checkpoints").glob("step_*"))[-1]
        return torch.load(newest / "state.pt", weights_only=True)["model"]

    a, b = final(tmp_path / "runs" / "tx"), final(tmp_path / "local")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_render_to_torchx_prints_the_appdef() -> None:
    proc = torchjob("render", "--to", "torchx", "jobs/examples/elastic.yaml", env=torchx_env(),
                    timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "min_replicas: 1" in proc.stdout and "num_replicas: 2" in proc.stdout
    assert "-m torchjob.trainer.agent --run-dir runs/digits-elastic" in proc.stdout \
        and "--nnodes 1:2" in proc.stdout


@pytest.mark.parametrize("to, message", [
    ("torchx:nope", "unknown TorchX scheduler 'nope'; choose from"),
    ("torchx", "say which TorchX scheduler"),
])
def test_submit_to_a_bad_scheduler_exits_2(to: str, message: str) -> None:
    proc = torchjob("submit", "--to", to, "jobs/examples/default.yaml", env=torchx_env(),
                    timeout=600)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr

"""``trainer.script``: a user's own script instead of a module, through every backend's one
agent command (the Slurm batch script's too), and for real through `torchjob run` and TorchX
local_cwd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.command import agent_command
from jobs.components import train
from jobs.load import build
from jobs.values import SpecError
from k8s.trainjob import render_trainjob
from slurm.sbatch import render_sbatch
from tests.jobs.test_jobs_components import torchx_env
from tests.procs import ROOT, env_for_tests

SCRIPT = "jobs/examples/ddp_script.py"


def spec(**trainer: object):  # type: ignore[no-untyped-def]
    return build({"name": "s", "nproc_per_node": 2, "trainer": trainer}, source="test")


def test_script_replaces_the_module_right_after_the_agent_flags() -> None:
    command = agent_command(spec(script=SCRIPT, args={"steps": 5}), python="py",
                            rdzv_endpoint="h:1", run_id="r")
    at = command.index(SCRIPT)
    assert command[at - 2:at] == ("--monitor-interval", "0.1") and "-m" not in command[3:]
    assert command[at + 1:] == ("--run-dir", "runs/s", "--checkpoint-dir", "runs/s/checkpoints",
                                "--steps", "5")


def test_script_args_are_the_scripts_own() -> None:
    """Not the trainer's options: a script's arguments are not checked by the trainer."""
    assert spec(script=SCRIPT, args={"steps": 5}).trainer.args == {"steps": 5}
    with pytest.raises(SpecError, match="steps"):
        spec(args={"steps": 5})


@pytest.mark.parametrize("trainer, message", [
    ({"script": SCRIPT, "module": "mypkg.train"}, "both set"),
    ({"script": "-x.py"}, "starts with '-'"),
    ({"script": "a\nb.py"}, "single line"),
])
def test_bad_script_settings(trainer: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        spec(**trainer)
    assert "trainer." in str(err.value)


def test_trainjob_keeps_the_script_and_its_arguments() -> None:
    job = render_trainjob(spec(script="/app/train.py", args={"steps": 5}))
    assert job["spec"]["trainer"]["command"] == [
        "torchrun", "--max-restarts", "3", "--monitor-interval", "0.1", "/app/train.py",
        "--run-dir", "runs/s", "--checkpoint-dir", "runs/s/checkpoints", "--steps", "5"]


def test_component_takes_a_script_or_a_module() -> None:
    args = train("--steps", "5", script=SCRIPT, j="1x2").roles[0].args[1]
    assert f"--monitor-interval 0.1 {SCRIPT} --run-dir" in args and args.endswith("--steps 5")
    assert "-m mypkg.train --run-dir" in train(m="mypkg.train").roles[0].args[1]
    with pytest.raises(ValueError, match="give one"):
        train(m="trainer", script=SCRIPT)


def test_slurm_script_runs_the_script_under_each_nodes_agent() -> None:
    text = render_sbatch(spec(script=SCRIPT, args={"steps": 5}), python="py", workdir="/w")
    assert f"--monitor-interval 0.1 {SCRIPT} --run-dir runs/s --checkpoint-dir " \
        "runs/s/checkpoints --steps 5 &" in text


@pytest.mark.integration
def test_torchjob_run_trains_the_example_script(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "jobs", "run", "jobs/examples/script.yaml",
                          "--set", f"run_dir={tmp_path}/run"], cwd=ROOT, env=env_for_tests(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run/result.json").read_text())
    assert result["world_size"] == 2 and result["final_loss"] < 1e-2, result


def test_missing_script_is_a_user_error_and_nothing_starts(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "jobs", "run", "jobs/examples/script.yaml",
                          "--set", "trainer.script=nowhere/train.py",
                          "--set", f"run_dir={tmp_path}/run"], cwd=ROOT, env=env_for_tests(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "'nowhere/train.py' is not a file" in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_torchx_local_cwd_runs_the_script(tmp_path: Path) -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "torchx"), "run", "-s", "local_cwd",
                          f"{ROOT}/jobs/components.py:train", "-j", "1x2", "--name", "sx",
                          "--script", f"{ROOT}/{SCRIPT}", "--", "--steps", "20"],
                         cwd=tmp_path, env=torchx_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "runs/sx/result.json").read_text())
    assert result == {**result, "world_size": 2, "steps": 20}

"""Checkpoints of another configuration are refused before anything is submitted (exit 2),
where the backend's nodes see this machine's run directory (torchjob.jobs.preflight)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from torchjob.jobs import backend as registry
from torchjob.jobs.cli import main
from torchjob.jobs.load import loads
from torchjob.jobs.preflight import check_checkpoints
from torchjob.jobs.values import UserError
from torchjob.trainer.config import parse_args

JOB = "name: pre\ntrainer:\n  args: {epochs: 2, lr: 0.003}\n"


def old_checkpoint(cwd: Path, **changed: object) -> Path:
    """A finished checkpoint of the job JOB describes, with ``changed`` trainer settings."""
    spec = loads(JOB)
    cfg = dataclasses.replace(parse_args(["--epochs", "2", "--lr", "0.003"]), **changed)
    step = cwd / spec.checkpoint_dir / "step_00000007"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(json.dumps({"config": dataclasses.asdict(cfg)}))
    return step


def test_another_configuration_is_refused_naming_the_field(tmp_path: Path) -> None:
    old_checkpoint(tmp_path, lr=0.01, seed=4)
    with pytest.raises(UserError, match=r"lr: 0.01 -> 0.003; seed: 4 -> 0.*--fresh"):
        check_checkpoints(loads(JOB), tmp_path)


@pytest.mark.parametrize("overrides", [[], ["trainer.args.epochs=9"], ["resume=force"],
                                       ["resume=fresh"], ["trainer.script=x.py",
                                                          "trainer.args=[1]"]])
def test_the_same_training_a_forced_or_fresh_run_or_a_script_passes(
        tmp_path: Path, overrides: list[str]) -> None:
    old_checkpoint(tmp_path, epochs=5)  # fewer epochs: the same trajectory, extended
    check_checkpoints(loads(JOB, overrides), tmp_path)


def test_an_unfinished_checkpoint_is_passed_over(tmp_path: Path) -> None:
    old_checkpoint(tmp_path)
    (tmp_path / "runs/pre/checkpoints/step_00000009").mkdir()  # no manifest yet
    check_checkpoints(loads(JOB), tmp_path)


def test_run_refuses_before_starting_anything(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    old_checkpoint(tmp_path, lr=0.01)
    (tmp_path / "job.yaml").write_text(JOB)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--to", "local", "job.yaml"]) == 2
    assert "lr: 0.01 -> 0.003" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "runs/pre")) == ["checkpoints"]  # no run record


def test_which_backends_see_the_run_directory() -> None:
    seeing = {name for name in ("local", "docker", "slurm", "slurm:sbatch", "torchx:local_cwd",
                                "torchx:slurm", "k8s", "k8s:trainjob", "torchx:kubernetes")
              if registry.get(name).sees_run_dir}
    assert seeing == {"local", "docker", "slurm", "slurm:sbatch", "torchx:local_cwd",
                      "torchx:slurm"}

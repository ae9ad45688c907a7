"""Checkpoints of another configuration are refused before anything is submitted (exit 2),
where the backend's nodes see this machine's run directory; a script that does not compile,
where they run this machine's Python (torchjob.jobs.preflight)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from torchjob.jobs import backend as registry
from torchjob.jobs.cli import main
from torchjob.jobs.load import loads
from torchjob.jobs.preflight import check_checkpoints, check_syntax
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


BAD = {"bad.py": "import torch\ndef f(:\n    pass\n", "outside.py": "print(1)\nreturn 3\n",
       "pkg/train.py": "x = (\n"}
WHY = {"bad.py": "SyntaxError: invalid syntax ({}, line 2: def f(:)",
       "outside.py": "SyntaxError: 'return' outside function ({}, line 2: return 3)",
       "pkg/train.py": "SyntaxError: '(' was never closed ({}, line 1: x = ()"}


@pytest.mark.parametrize("to", ["local", "slurm", "torchx:local_cwd"])
@pytest.mark.parametrize("name", sorted(BAD))
def test_a_script_that_does_not_compile_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        to: str, name: str) -> None:
    """Where the nodes run this machine's Python (local, Slurm without a container, TorchX's
    local_cwd): exit 2 with the line, before any cluster is asked (Slurm is down here)."""
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(BAD[name])
    monkeypatch.chdir(tmp_path)
    target = ["-m", "pkg.train"] if name == "pkg/train.py" else [name]
    assert main(["run", "--to", to, *target]) == 2
    err = capsys.readouterr().err
    what = "trainer.module 'pkg.train'" if target[0] == "-m" else f"trainer.script {target[0]!r}"
    assert f"{what} does not compile under the nodes' Python 3." in err, err
    assert WHY[name].format(tmp_path / name) in err, err
    assert not (tmp_path / "runs").exists()


def test_where_the_nodes_run_their_own_python_it_is_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An image's Python may read syntax this one does not (3.12's f-strings in 3.11): said,
    not refused."""
    (tmp_path / "train.py").write_text("def f(:\n")
    check_syntax(loads("name: w\ntrainer: {script: train.py}"), tmp_path, None)
    err = capsys.readouterr().err
    assert err.startswith("torchjob: warning: trainer.script 'train.py' does not compile under "
                          "this machine's Python 3."), err
    assert "going on, as the nodes run it with their own Python" in err, err


def test_a_script_that_compiles_is_not_run_and_what_cannot_be_checked_passes(
        tmp_path: Path) -> None:
    """Compiling runs nothing; a file the interpreter cannot be started for, a zip file, a
    script or module that is not here are left to the nodes."""
    (tmp_path / "train.py").write_text("#!/usr/bin/env python\n# -*- coding: latin-1 -*-\n"
                                       "from __future__ import annotations\n"
                                       "open('ran', 'w').write('ran')\n")
    for spec in ("name: w\ntrainer: {script: train.py}", "name: w\ntrainer: {script: missing.py}",
                 "name: w\ntrainer: {module: nowhere.train}", "name: w\ntrainer: {module: train}"):
        check_syntax(loads(spec), tmp_path, sys.executable)
    assert not (tmp_path / "ran").exists()
    (tmp_path / "bad.py").write_text("def f(:\n")
    check_syntax(loads("name: w\ntrainer: {script: bad.py}"), tmp_path, str(tmp_path / "no-python"))
    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as archive:
        archive.writestr("__main__.py", "def f(:\n")
    check_syntax(loads("name: w\ntrainer: {script: app.pyz}"), tmp_path, sys.executable)

"""The run and checkpoint directories are checked before any work (torchjob.trainer.dirs): by
the trainer on every rank and by the agent, so that a job started by hand (torchrun, srun, a
pod) stops with exit 2 and one clear line instead of a traceback at the first save."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from torchjob.trainer.dirs import unusable
from tests.procs import PYTHON, env_for_tests


def test_what_makes_a_directory_unusable(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert unusable(tmp_path / "new" / "deeper") is None  # made with its parents
    assert unusable(tmp_path) is None
    assert unusable(tmp_path / "afile") == f"{tmp_path / 'afile'} is a file, not a directory: " \
        "name a directory (or move the file away)"
    assert "afile (on its path) is a file" in str(unusable(tmp_path / "afile" / "x" / "y"))
    assert "is a broken symbolic link" in str(unusable(tmp_path / "dangling" / "x"))
    locked = tmp_path / "locked"
    locked.mkdir()
    subprocess.run(["chattr", "+i", str(locked)], check=True)  # read-only for root too
    try:
        assert "(on its path) cannot be written (Operation not permitted)" in str(
            unusable(locked / "checkpoints"))
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert list(locked.iterdir()) == [] and not list(tmp_path.glob(".torchjob-probe-*"))


@pytest.mark.parametrize("agent", [False, True])
def test_the_trainer_and_the_agent_stop_before_training(tmp_path: Path, agent: bool) -> None:
    (tmp_path / "afile").write_text("")
    trainer = ["-m", "torchjob.trainer", "--run-dir", "run", "--checkpoint-dir", "afile/ck",
               "--epochs", "1", "--progress", "lines"]
    argv = [PYTHON, "-m", "torchjob.trainer.agent", "--checkpoint-dir", "afile/ck",
            "--standalone", "--nproc-per-node", "1", *trainer] if agent else [PYTHON, *trainer]
    proc = subprocess.run(argv, cwd=tmp_path, env=env_for_tests(), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "afile (on its path) is a file, not a directory" in proc.stderr.splitlines()[-1]
    assert " step " not in proc.stderr and "Traceback" not in proc.stderr

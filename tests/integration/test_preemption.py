"""Stop signals: finish the step, checkpoint, exit 143; the same command again ends where an
uninterrupted run ends, bit for bit."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.procs import (PYTHON, assert_bitwise_equal, env_for_tests, final_params, last_step,
                         linger_at_exit, lingering, wait_for)

pytestmark = pytest.mark.integration
ARGS = ["--epochs", "3", "--checkpoint-every", "0", "--log-every", "1", "--progress", "lines"]


def trainer(run_dir: Path) -> list[str]:
    return [PYTHON, "-m", "torchjob.trainer", "--run-dir", str(run_dir), *ARGS]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    run = tmp_path_factory.mktemp("reference")
    subprocess.run(trainer(run), env=env_for_tests(), check=True, capture_output=True,
                   timeout=300)
    return final_params(run / "checkpoints")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2])
def test_signal_checkpoints_and_exits_143_then_resumes(tmp_path: Path, reference: dict,
                                                        sig: signal.Signals) -> None:
    proc = subprocess.Popen(trainer(tmp_path), env=env_for_tests(), stderr=subprocess.PIPE,
                            text=True)
    wait_for(lambda: last_step(tmp_path) >= 20 or proc.poll() is not None, 120, "step 20")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert f"stopped by {sig.name}" in err
    stopped_at = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert len(stopped_at) == 1 and int(stopped_at[0].name[5:]) < 66

    again = subprocess.run(trainer(tmp_path), env=env_for_tests(), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resumed from {stopped_at[0].name}" in again.stderr
    assert_bitwise_equal(final_params(tmp_path / "checkpoints"), reference)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_a_stop_signal_while_a_finished_trainer_exits_changes_nothing(
        tmp_path: Path, sig: signal.Signals) -> None:
    """Slurm's time-limit USR2 may land as a finished run's process exits (the last CI run
    saw it: the task died of it in the interpreter's finalization and the job was FAILED).
    The work is done, so it is ignored: the process exits 0."""
    window = tmp_path / "exiting"
    window.mkdir()
    run = tmp_path / "run"
    proc = subprocess.Popen([PYTHON, "-m", "torchjob.trainer", "--run-dir", str(run), "--epochs",
                             "1", "--progress", "lines"],
                            env=env_for_tests(**linger_at_exit(window, 4)),
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: lingering(window) or proc.poll() is not None, 120, "the process's exit")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert lingering(window) == [proc.pid], err[-2000:]
    assert proc.returncode == 0, err[-2000:]
    assert (run / "summary.json").exists()

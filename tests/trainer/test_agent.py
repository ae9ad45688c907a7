"""`python -m trainer.agent`: torchrun's arguments, the trainer's exit codes."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests, last_step, wait_for
from trainer.agent import exit_code


@pytest.mark.parametrize("codes, expected", [({2}, 2), ({2, 1}, 2), ({143}, 143),
                                             ({143, 1}, 1), ({1}, 1), ({-9}, 1)])
def test_exit_code_keeps_the_trainers_meaning(codes: set[int], expected: int) -> None:
    assert exit_code(codes) == expected


def agent(run_dir: Path, *args: str) -> list[str]:
    return [PYTHON, "-m", "trainer.agent", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0", "-m", "trainer", "--run-dir", str(run_dir),
            "--progress", "lines", *args]


@pytest.mark.integration
def test_a_config_error_in_the_workers_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(agent(tmp_path, "--sync-bn", "true"), env=env_for_tests(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]


@pytest.mark.integration
def test_sigterm_to_the_agent_exits_143_after_a_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(agent(tmp_path, "--epochs", "30", "--log-every", "1"),
                            env=env_for_tests(), stderr=subprocess.PIPE, text=True)
    wait_for(lambda: last_step(tmp_path) >= 10 or proc.poll() is not None, 120, "step 10")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in err
    assert list((tmp_path / "checkpoints").glob("step_*"))

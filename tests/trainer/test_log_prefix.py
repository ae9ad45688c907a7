"""The one log prefix (torchjob.trainer.contract.LOG_PREFIX: node, rank, attempt) on every line a
worker prints under ``python -m torchjob.trainer.agent``, attempt counting the agent's restarts on
top of TORCHJOB_ATTEMPT_BASE (set where the scheduler itself runs a job again)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, ROOT, env_for_tests
from torchjob.trainer.contract import LOG_PREFIX, log_prefix, parse_log_prefix

# rank 1 of the first attempt is killed once rank 0 has written its lines (the agent stops rank
# 0 then): the agent restarts both workers once
WORKER = """
import os, signal, sys, time
rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
sys.stdout.write(f"out of {rank}\\n")
sys.stdout.flush()
sys.stderr.write(f"err of {rank}\\n")
sys.stderr.flush()
if rank == "0":
    open(f"rank0-wrote-{restart}", "w").close()
elif restart == "0":
    deadline = time.monotonic() + 60
    while not os.path.exists("rank0-wrote-0") and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_prefix_parses_back() -> None:
    assert log_prefix(1, 3, 0) == "[node 1 rank 3 attempt 0] " == \
        LOG_PREFIX.format(node=1, rank=3, attempt=0)
    assert parse_log_prefix(log_prefix(12, 345, 6) + "text [node 1] x") == \
        (12, 345, 6, "text [node 1] x")
    for line in ("[node 1] agent line", "[node 1 rank x attempt 0] y", " [node 1 rank 2 "
                 "attempt 0] z", "[attempt 0 rank 1]: old"):
        assert parse_log_prefix(line) is None


@pytest.mark.integration
def test_every_worker_line_carries_node_rank_and_attempt(tmp_path: Path) -> None:
    (tmp_path / "prefixworker.py").write_text(WORKER)
    (tmp_path / "tmp").mkdir()
    env = env_for_tests(TORCHJOB_ATTEMPT_BASE="2", PYTHONPATH=f"{tmp_path}:{ROOT}",
                        TMPDIR=str(tmp_path / "tmp"))
    proc = subprocess.run([PYTHON, "-m", "torchjob.trainer.agent", "--standalone",
                           "--nproc-per-node",
                           "2", "--max-restarts", "1", "--monitor-interval", "0.1", "-m",
                           "prefixworker"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    worker_out = sorted(line for line in proc.stdout.splitlines() if "out of" in line)
    worker_err = sorted(line for line in proc.stderr.splitlines() if "err of" in line)
    assert worker_out == sorted(f"{log_prefix(0, rank, attempt)}out of {rank}"
                                for attempt in (2, 3) for rank in (0, 1)), proc.stdout
    assert worker_err == sorted(f"{log_prefix(0, rank, attempt)}err of {rank}"
                                for attempt in (2, 3) for rank in (0, 1)), proc.stderr
    assert not list((tmp_path / "tmp").iterdir()), "the agent left its log directory"


def test_a_bad_attempt_base_exits_2_and_names_it() -> None:
    proc = subprocess.run([PYTHON, "-m", "torchjob.trainer.agent", "--standalone", "-m", "x"],
                          env=env_for_tests(TORCHJOB_ATTEMPT_BASE="one"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "TORCHJOB_ATTEMPT_BASE='one' is not a whole number" in proc.stderr

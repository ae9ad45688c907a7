"""A user script's default collective timeout (torchjob.trainer.collective_timeout): two real
gloo ranks run by the script runner as the agent runs them; a collective that one rank never
joins fails after the job's timeout, not torch's 30 minutes; torch is not imported early."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests, free_port

SCRIPT = """\
import datetime, os, sys, time
print("torch before the script:", "torch" in sys.modules, flush=True)
import torch
import torch.distributed as dist

explicit = os.environ.get("EXPLICIT")
dist.init_process_group("gloo", **({"timeout": datetime.timedelta(seconds=float(explicit))}
                                   if explicit else {}))
if dist.get_rank() == 1:
    time.sleep(60)  # alive, never joins: rank 0's collective can only time out
    sys.exit(0)
began = time.monotonic()
try:
    dist.all_reduce(torch.ones(1))
except Exception as exc:
    print(f"failed after {time.monotonic() - began:.1f} s: {type(exc).__name__}", flush=True)
    sys.exit(3)
"""


def ranks(tmp_path: Path, **extra: str) -> list[subprocess.Popen[str]]:
    script = tmp_path / "collective.py"
    script.write_text(SCRIPT)
    port = str(free_port())
    return [subprocess.Popen([PYTHON, "-m", "torchjob.trainer.script", str(script)],
                             env=env_for_tests(RANK=str(rank), WORLD_SIZE="2", MASTER_PORT=port,
                                               MASTER_ADDR="127.0.0.1", **extra),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in (0, 1)]


def rank0(procs: list[subprocess.Popen[str]]) -> tuple[int, str, float]:
    began = time.monotonic()
    try:
        out, _ = procs[0].communicate(timeout=50)
        return procs[0].returncode, out, time.monotonic() - began
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


@pytest.mark.integration
def test_a_scripts_collective_fails_after_the_jobs_timeout(tmp_path: Path) -> None:
    code, out, took = rank0(ranks(tmp_path, TORCHJOB_COLLECTIVE_TIMEOUT="3"))
    assert code == 3, out
    assert "torch before the script: False" in out
    seconds = float(out.split("failed after ")[1].split(" s")[0])
    assert 2.5 <= seconds < 15, out


@pytest.mark.integration
def test_a_scripts_own_timeout_wins(tmp_path: Path) -> None:
    code, out, _ = rank0(ranks(tmp_path, TORCHJOB_COLLECTIVE_TIMEOUT="30", EXPLICIT="2"))
    assert code == 3, out
    assert float(out.split("failed after ")[1].split(" s")[0]) < 15, out


def test_a_bad_value_stops_the_script_with_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "nothing.py"
    script.write_text("print('ran')\n")
    result = subprocess.run([PYTHON, "-m", "torchjob.trainer.script", str(script)],
                            env=env_for_tests(TORCHJOB_COLLECTIVE_TIMEOUT="soon"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "ran" not in result.stdout, result
    assert "TORCHJOB_COLLECTIVE_TIMEOUT='soon'" in result.stderr

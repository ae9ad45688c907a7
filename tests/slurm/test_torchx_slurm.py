"""`torchx run -s slurm --wait` of this project's component on the local two-node cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_torchx_run_slurm_wait_2x2(slurm_cluster: None, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchx"), "run", "-s", "slurm", "--wait",
         f"{ROOT}/jobs/backends/torchx/components.py:train", "-j", "2x2", "--name", "tx-slurm", "--",
         "--epochs", "3", "--batch-size", "16", "--progress", "lines"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "SUCCEEDED" in proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "runs" / "tx-slurm" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["accuracy"] >= 0.95, summary

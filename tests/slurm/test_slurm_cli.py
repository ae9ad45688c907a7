"""`torchjob submit|status|logs --to slurm` on the local cluster, and the same job through
TorchX's slurm scheduler ending with the same accuracy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm import slurm_cli

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slurm]
ARGS = {"epochs": "3", "batch_size": "16", "progress": "lines"}


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1"}


def torchjob(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobs", *argv], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=600)


def test_submit_status_logs_and_torchx_agree(slurm_cluster: None, tmp_path: Path) -> None:
    sets = [f"run_dir={tmp_path}/submitit", "nnodes=2", "name=cli-slurm"]
    sets += [f"trainer.args.{k}={v}" for k, v in ARGS.items()]
    sub = torchjob("submit", "--to", "slurm", "jobs/examples/default.yaml",
                   *[w for s in sets for w in ("--set", s)])
    assert sub.returncode == 0, sub.stderr
    handle = sub.stdout.strip()
    assert handle.startswith("slurm:")  # the handle names its backend
    job_id = handle.removeprefix("slurm:")
    assert slurm_cli.wait(job_id, timeout=600) == "COMPLETED"
    status = torchjob("status", handle)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout and "COMPLETED" in status.stdout
    logs = torchjob("logs", "--to", "slurm", job_id, "--log-dir",
                    f"{tmp_path}/submitit/submitit/{job_id}")
    assert logs.returncode == 0, logs.stderr
    assert {f"[attempt 0 rank {r}]" for r in range(4)} <= \
        {line[:18] for line in logs.stdout.splitlines()}

    torchx = subprocess.run(
        [str(Path(sys.executable).parent / "torchx"), "run", "-s", "slurm", "--wait",
         f"{ROOT}/jobs/components.py:train", "-j", "2x2", "--name", "tx-same", "--",
         *[w for k, v in ARGS.items() for w in (f"--{k.replace('_', '-')}", v)]],
        cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert torchx.returncode == 0, (torchx.stdout + torchx.stderr)[-3000:]
    ours = json.loads((tmp_path / "submitit" / "summary.json").read_text())
    theirs = json.loads((tmp_path / "runs" / "tx-same" / "summary.json").read_text())
    assert ours["world_size"] == theirs["world_size"] == 4
    assert ours["steps"] == theirs["steps"]
    assert ours["accuracy"] == theirs["accuracy"] >= 0.95, (ours, theirs)


def test_submit_to_a_missing_partition_exits_2(slurm_cluster: None) -> None:
    proc = torchjob("submit", "--to", "slurm", "jobs/examples/default.yaml", "--set",
                    "slurm.partition=nope")
    assert proc.returncode == 2 and "nope" in proc.stderr and "Traceback" not in proc.stderr


def test_status_of_an_unknown_job_exits_2(slurm_cluster: None) -> None:
    proc = torchjob("status", "--to", "slurm", "999999")
    assert proc.returncode == 2 and "knows no job '999999'" in proc.stderr

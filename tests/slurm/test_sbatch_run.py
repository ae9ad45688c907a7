"""Rendered sbatch scripts on the real local cluster: 2 nodes x 2 workers, and a stop + requeue.

Each job is named ``sbatch-test-...`` so that it can be told apart from other tests' jobs on
the shared cluster; a test cancels only the job it submitted.
"""

from __future__ import annotations

import collections
import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobs.load import loads
from slurm.sbatch import render_sbatch
from tests.procs import PYTHON, ROOT, env_for_tests, last_step, wait_for

if TYPE_CHECKING:
    from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

# torchjob run's default: 2 processes x batch 32 = 64 samples per step; here 4 ranks x 16.
TWO_BY_TWO = "nnodes: 2\nnproc_per_node: 2\ntrainer: {args: {batch_size: 16, %s}}\n"
REQUEUE_WAIT_S = 400  # Slurm holds a requeued job ~2 min (credential expiry) before it restarts


def submit(tmp_path: Path, name: str, yaml: str) -> tuple[Path, Path]:
    """Render the job with this checkout and interpreter; return (script, run_dir)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = loads(f"name: {name}\nrun_dir: {json.dumps(str(run_dir))}\n{yaml}")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec, python=PYTHON, workdir=str(ROOT)))
    return script, run_dir


def sbatch_wait(script: Path, timeout: float) -> subprocess.Popen[str]:
    return subprocess.Popen(["sbatch", "--parsable", "--wait", str(script)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env_for_tests())


def finish(proc: subprocess.Popen[str], job_id: str, run_dir: Path,
           timeout: float) -> tuple[int, str]:
    """Wait for ``sbatch --wait``; on a timeout cancel our job and fail with its log."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", job_id], check=False)
        proc.kill()
        pytest.fail(f"job {job_id} still running after {timeout}s:\n{logs(run_dir)[-3000:]}")
    return proc.returncode, out + err


def logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("slurm-*")))


def job_id_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip().split(";")[0]


def train_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r.get("kind") == "train"]


def test_default_job_on_two_nodes_by_two(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script, run_dir = submit(tmp_path, "sbatch-test-default", TWO_BY_TWO % "epochs: 12")
    proc = sbatch_wait(script, 300)
    job_id = job_id_of(proc)
    code, output = finish(proc, job_id, run_dir, 300)
    assert code == 0, f"{output}\n{logs(run_dir)[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["accuracy"] >= 0.95, summary
    assert f"rendezvous n1:{12000 + int(job_id) % 20000}" in logs(run_dir)


def test_usr2_checkpoints_requeues_and_loses_no_step(slurm_cluster: SlurmCluster,
                                                     tmp_path: Path) -> None:
    """USR2 to the batch shell (what --signal=B:USR2@N sends before the time limit): the
    workers checkpoint and exit 143, the script requeues the job, the next attempt resumes."""
    script, run_dir = submit(tmp_path, "sbatch-test-requeue",
                             "slurm: {max_requeues: 1}\n"
                             + TWO_BY_TWO % "epochs: 20, log_every: 1, checkpoint_every: 1000")
    proc = sbatch_wait(script, REQUEUE_WAIT_S)
    job_id = job_id_of(proc)
    try:
        wait_for(lambda: last_step(run_dir) >= 40, 120, "step 40")
    except AssertionError:
        subprocess.run(["scancel", job_id], check=False)
        raise
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True)
    started = time.monotonic()
    code, output = finish(proc, job_id, run_dir, REQUEUE_WAIT_S)
    text = logs(run_dir)
    assert code == 0, f"{output}\n{text[-3000:]}"
    assert "attempt 1 on 2 node(s)" in text and "requeueing, attempt 1 of 1" in text, text
    stopped = [line for line in text.splitlines() if "stopped by SIGTERM after step" in line]
    assert len(stopped) == 4, text  # every rank stopped, after the same step
    step = int(stopped[0].split("after step ")[1].split(":")[0])
    assert step < 440 and f"from step {step}" in text, text  # 22 steps/epoch x 20 epochs
    steps = train_steps(run_dir)
    counts = collections.Counter(steps)
    assert sorted(counts) == list(range(1, 441)), "a step is missing"
    assert [s for s, n in counts.items() if n > 1] == [], "a step ran twice"
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 4
    assert time.monotonic() - started < REQUEUE_WAIT_S


def test_scontrol_requeue_mid_run_resumes_from_the_last_checkpoint(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """``scontrol requeue`` (or preemption) sends SIGTERM to every process of the job at once,
    so the workers stop without a final checkpoint: the next attempt resumes from the last
    periodic one. No step is lost, and only steps after that checkpoint run twice."""
    every = 20
    script, run_dir = submit(tmp_path, "sbatch-test-scontrol-requeue", TWO_BY_TWO
                             % f"epochs: 20, log_every: 1, checkpoint_every: {every}")
    proc = sbatch_wait(script, REQUEUE_WAIT_S)
    job_id = job_id_of(proc)
    try:
        wait_for(lambda: last_step(run_dir) >= 50, 120, "step 50")
    except AssertionError:
        subprocess.run(["scancel", job_id], check=False)
        raise
    subprocess.run(["scontrol", "requeue", job_id], check=True, env=env_for_tests())
    code, output = finish(proc, job_id, run_dir, REQUEUE_WAIT_S)
    text = logs(run_dir)
    assert code == 0, f"{output}\n{text[-3000:]}"
    resumed = [line for line in text.splitlines() if "training 440 steps" in line]
    assert len(resumed) == 2 and resumed[0].endswith("from step 0"), text
    start = int(resumed[1].rsplit("from step ", 1)[1])
    assert start >= 40 and start % every == 0, resumed
    counts = collections.Counter(train_steps(run_dir))
    assert sorted(counts) == list(range(1, 441)), "a step is missing"
    assert all(s > start for s, n in counts.items() if n > 1), \
        "a step before the checkpoint ran twice"

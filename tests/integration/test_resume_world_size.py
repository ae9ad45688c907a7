"""Resuming at 4 ranks, and at another world size.

An elastic job resumed at another world size continues from the same point of its epoch.

World 2 writes a checkpoint 16 micro-batches into epoch 0 (of 22 at world 2); world 4 has
only 11 per epoch, so the position must be counted in samples, not reused as it is (it used to
crash every worker with ``__len__() should return >= 0`` until the restarts ran out).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.procs import (PYTHON, ROOT, assert_bitwise_equal, env_for_tests, final_params,
                         last_step, wait_for)

pytestmark = pytest.mark.integration
JOB = ROOT / "jobs" / "examples" / "default.yaml"


def settings(run_dir: Path, nproc: int, *args: str) -> list[str]:
    return [f"run_dir={run_dir}", f"nproc_per_node={nproc}", "max_restarts=0",
            "trainer.args.epochs=2", "trainer.args.eval_every=0",
            "trainer.args.progress=lines", *args]


def run(run_dir: Path, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "jobs", "run", str(JOB),
                           *[a for s in settings(run_dir, nproc, *args) for a in ("--set", s)]],
                          env=env_for_tests(), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("before, after, expect", [(2, 4, "epoch 0 micro-batch 8 of world "
                                                          "size 4"),
                                                   (4, 2, "epoch 0 micro-batch 16 of world "
                                                          "size 2")])
def test_resumed_at_another_world_size_continues_the_epoch(tmp_path: Path, before: int,
                                                           after: int, expect: str) -> None:
    at = {2: 16, 4: 8}[before]  # 8/11 of an epoch: past the end of the half-as-long one
    first = run(tmp_path, before, f"trainer.args.checkpoint_every={at}",
                f"trainer.args.max_steps={at + 1}")
    assert first.returncode == 0, first.stderr[-3000:]
    # keep the mid-epoch checkpoint only, as if the job had been stopped right after it
    checkpoints = sorted((tmp_path / "checkpoints").glob("step_*"))
    mid = [p for p in checkpoints
           if json.loads((p / "manifest.json").read_text())["position"]["micro"]]
    assert mid, [p.name for p in checkpoints]
    for path in checkpoints:
        if path not in mid:
            shutil.rmtree(path)
    second = run(tmp_path, after)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"world size changed from {before} to {after}" in second.stderr
    assert expect in second.stderr, second.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == after and summary["accuracy"] > 0.8, summary


def test_resumed_at_four_ranks_ends_bit_for_bit(tmp_path: Path) -> None:
    """Three or more ranks sum in an order set by DDP's bucket layout; a resumed run must use
    the layout an uninterrupted one uses at the same step, or the rounding drifts."""
    reference = run(tmp_path / "reference", 4, "trainer.args.log_every=1")
    assert reference.returncode == 0, reference.stderr[-3000:]
    resumed = tmp_path / "resumed"
    proc = subprocess.Popen([PYTHON, "-m", "jobs", "run", str(JOB),
                             *[a for s in settings(resumed, 4, "trainer.args.log_every=1")
                               for a in ("--set", s)]],
                            env=env_for_tests(), stderr=subprocess.PIPE, text=True)
    wait_for(lambda: last_step(resumed) >= 5 or proc.poll() is not None, 300, "step 5")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    again = run(resumed, 4, "trainer.args.log_every=1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step_" in again.stderr
    assert_bitwise_equal(final_params(resumed / "checkpoints"),
                         final_params(tmp_path / "reference" / "checkpoints"))

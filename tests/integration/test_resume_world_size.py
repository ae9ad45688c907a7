"""Resuming at another world size: trained at 4 ranks, stopped mid-epoch, resumed at 2 and 3.

The rule (trainer/data.py): the position is a global count of the epoch's samples done, each
optimizer step takes the next world x batch x accumulation samples, and only a tail shorter
than one step is left out of an epoch. So after a resume at any world size the global step
carries on, every sample of the epoch is trained on exactly once (as ``--log-samples``
records it) but that tail, and the loss continues from where it was. Resumed at 4 ranks the
run ends bit for bit as an uninterrupted one, ``--log-samples`` or not.

The stop: the uninterrupted 4-rank run writes a checkpoint after step 7 of its 11-step epoch
(896 samples: a multiple of neither 3 x 16 nor 3 x 32, the sizes a 3-rank micro-batch and
step take); each resumed run starts from a copy of that checkpoint and of the sample records,
as if the job had stopped right after writing it. The records the 4-rank run wrote after step
7 are replaced by the resumed run's (torchjob.trainer.samples.trained).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.procs import (PYTHON, ROOT, assert_bitwise_equal, env_for_tests, final_params,
                         torchjob)
from torchjob.trainer.samples import trained
from torchjob.trainer.tasks import digits_task

pytestmark = pytest.mark.integration
JOB = ROOT / "jobs" / "examples" / "default.yaml"
BATCH, ACCUM, AT, EPOCHS = 16, 2, 7, 2
# The first two steps after the resume against the uninterrupted run's same two steps: both
# start from the weights of step 7 and differ only in which samples rank 0 holds and in the
# step sizes after the first. Measured (rank 0's loss, mean of steps 8 and 9): 1.494 at 4
# ranks, 1.402 at 3, 1.400 at 2, for DDP and FSDP alike; a run that lost its weights would
# show ln 10 = 2.30 or more, as steps 1 and 2 do (2.42).
LOSS_TOLERANCE = 0.3


def size() -> int:
    return len(digits_task().train)  # type: ignore[arg-type]


def run(run_dir: Path, nproc: int, parallel: str, *, log_samples: bool = True
        ) -> subprocess.CompletedProcess[str]:
    sets = [f"run_dir={run_dir}", f"nproc_per_node={nproc}", "max_restarts=0",
            f"trainer.args.epochs={EPOCHS}", f"trainer.args.batch_size={BATCH}",
            f"trainer.args.grad_accum={ACCUM}", f"trainer.args.checkpoint_every={AT}",
            "trainer.args.keep_checkpoints=10", f"trainer.args.parallel={parallel}",
            f"trainer.args.log_samples={str(log_samples).lower()}",
            "trainer.args.log_every=1", "trainer.args.progress=lines"]
    proc = torchjob("run", str(JOB), *[a for s in sets for a in ("--set", s)],
                    env=env_for_tests(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def resume(reference: Path, run_dir: Path, nproc: int, parallel: str,
           **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run from a copy of the reference's mid-epoch checkpoint and of its sample records."""
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / f"step_{AT:08d}",
                    run_dir / "checkpoints" / f"step_{AT:08d}")
    shutil.copytree(reference / "samples", run_dir / "samples")
    return run(run_dir, nproc, parallel, **kwargs)


def metrics(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[str, Path]:
    """The uninterrupted 4-rank run: its checkpoint after step 7 is where the others start."""
    parallel = request.param
    run_dir = tmp_path_factory.mktemp(f"reference-{parallel}")
    run(run_dir, 4, parallel)
    manifest = json.loads((run_dir / "checkpoints" / f"step_{AT:08d}" / "manifest.json")
                          .read_text())
    assert manifest["position"] == {"step": AT, "epoch": 0, "samples": AT * 4 * BATCH * ACCUM}
    return parallel, run_dir


@pytest.mark.parametrize("nproc", [3, 2])
def test_resumed_at_another_world_size_sees_each_sample_once(
        tmp_path: Path, reference: tuple[str, Path], nproc: int) -> None:
    parallel, ref = reference
    proc = resume(ref, tmp_path, nproc, parallel)
    assert f"world size changed from 4 to {nproc}" in proc.stderr, proc.stderr[-3000:]
    n, done, step_samples = size(), AT * 4 * BATCH * ACCUM, nproc * BATCH * ACCUM
    left = (n - done) // step_samples  # the optimizer steps the new world size has left
    assert f"continuing epoch 0 after its first {done} samples" in proc.stderr

    # the global step carries on: step 8 first, no step twice, then a whole epoch at nproc
    steps = [r["step"] for r in metrics(tmp_path, "train")]
    assert steps == list(range(AT + 1, AT + left + n // step_samples + 1)), steps
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == steps[-1]

    # each sample once in each epoch; left out only a tail shorter than one step at nproc
    epochs = trained(tmp_path)
    for epoch, expected in [(0, done + left * step_samples),
                            (1, n // step_samples * step_samples)]:
        seen = epochs[epoch]
        twice = sorted({i for i in seen if seen.count(i) > 1})
        assert not twice, f"epoch {epoch}: samples trained on twice: {twice[:20]}"
        assert len(seen) == expected and n - expected < step_samples, (epoch, len(seen))
        assert set(seen) <= set(range(n))
    headers = [json.loads(p.read_text().splitlines()[0])
               for p in sorted((tmp_path / "samples").glob("attempt002-*"))]
    assert [(h["world_size"], h["rank"], h["resumed"]["step"]) for h in headers] == \
        [(nproc, r, AT) for r in range(nproc)]

    # the loss continues from the checkpoint: the same level as the uninterrupted run's
    ref_loss = [r["loss"] for r in metrics(ref, "train") if AT < r["step"] <= AT + 2]
    loss = [r["loss"] for r in metrics(tmp_path, "train") if AT < r["step"] <= AT + 2]
    assert sum(ref_loss) / 2 < math.log(10) - 2 * LOSS_TOLERANCE  # the check has teeth
    assert abs(sum(loss) / 2 - sum(ref_loss) / 2) < LOSS_TOLERANCE, (loss, ref_loss)
    assert metrics(tmp_path, "eval")[-1]["accuracy"] > 0.9


@pytest.mark.parametrize("reference", ["ddp"], indirect=True)
def test_resumed_at_four_ranks_ends_bit_for_bit(tmp_path: Path,
                                                reference: tuple[str, Path]) -> None:
    """Three or more ranks sum in an order set by DDP's bucket layout; a resumed run must use
    the layout an uninterrupted one uses at the same step, or the rounding drifts. Resumed
    without --log-samples: recording the samples changes nothing that is trained."""
    parallel, ref = reference
    proc = resume(ref, tmp_path, 4, parallel, log_samples=False)
    assert f"resumed from step_{AT:08d}" in proc.stderr
    assert_bitwise_equal(final_params(tmp_path / "checkpoints"),
                         final_params(ref / "checkpoints"))


def test_more_max_steps_trains_on_from_where_the_last_stopped(tmp_path: Path) -> None:
    """A run that max_steps ended mid-epoch keeps its place there (it used to record the end
    of all epochs, so raising max_steps trained nothing more)."""
    def trainer(max_steps: int) -> None:
        proc = subprocess.run([PYTHON, "-m", "torchjob.trainer", "--run-dir", str(tmp_path),
                               "--max-steps", str(max_steps), "--log-every", "1",
                               "--eval-every", "0", "--checkpoint-every", "0",
                               "--progress", "lines"],
                              env=env_for_tests(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    trainer(3)
    manifest = json.loads((tmp_path / "checkpoints" / "step_00000003" / "manifest.json")
                          .read_text())
    assert manifest["position"] == {"step": 3, "epoch": 0, "samples": 3 * 32}
    trainer(5)
    assert [r["step"] for r in metrics(tmp_path, "train")] == [1, 2, 3, 4, 5]

"""The trainer's options, each run for real over gloo with two processes on CPU."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests, last_step, wait_for

pytestmark = pytest.mark.integration


def torchrun(run_dir: Path, *args: str) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "torchjob.trainer", "--run-dir", str(run_dir), "--progress", "lines", *args]


def run_ok(cmd: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env_for_tests(**env), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# Options that do not interact share a run: each run costs about 15 s of CPU, nearly all of it
# imports. FSDP with async checkpoints is test_fsdp_stop_and_resume's; grad-accum and the
# synthetic task's size are test_gradient_accumulation_equals_a_bigger_batch's (and test_gpt's
# with FSDP).
def test_bf16_a_loader_worker_and_async_checkpoints_train_digits(tmp_path: Path) -> None:
    run_ok(torchrun(tmp_path, "--epochs", "4", "--precision", "bf16", "--num-workers", "1",
                    "--async-checkpoint", "true", "--checkpoint-every", "10"))
    result = summary(tmp_path)
    assert result["world_size"] == 2 and result["accuracy"] >= 0.9, result


def test_fsdp_stop_and_resume(tmp_path: Path) -> None:
    """FSDP with async checkpoints every 10 steps: SIGTERM at step 20 or after saves a sharded
    checkpoint where it stopped, which the same command resumes from, to the accuracy."""
    cmd = torchrun(tmp_path, "--parallel", "fsdp", "--epochs", "4", "--log-every", "1",
                   "--async-checkpoint", "true", "--checkpoint-every", "10")
    proc = subprocess.Popen(cmd, env=env_for_tests(), stderr=subprocess.PIPE, text=True)
    wait_for(lambda: last_step(tmp_path) >= 20 or proc.poll() is not None, 120, "step 20")
    proc.send_signal(signal.SIGTERM)  # torchrun passes it to both workers
    _, err = proc.communicate(timeout=120)
    assert "stopped by SIGTERM" in err, err[-3000:]
    stop = sorted((tmp_path / "checkpoints").glob("step_*"))[-1]
    assert (stop / ".metadata").exists()  # torch.distributed.checkpoint's sharded layout
    again = run_ok(cmd)
    assert f"resumed from {stop.name}" in again.stderr
    assert summary(tmp_path)["accuracy"] >= 0.9


def test_gradient_accumulation_equals_a_bigger_batch(tmp_path: Path) -> None:
    """no_sync on the first micro-step, all-reduce on the last: the same update as one batch
    of twice the size (up to float rounding). The synthetic MLP has no BatchNorm or dropout,
    whose batch statistics and random draws would differ."""
    common = ["--task", "synthetic", "--synthetic-samples", "2048", "--synthetic-dim", "32",
              "--synthetic-hidden", "64", "--epochs", "1", "--clip-grad", "0", "--log-every",
              "5", "--precision", "fp32"]
    run_ok(torchrun(tmp_path / "a", *common, "--batch-size", "32", "--grad-accum", "2"))
    run_ok(torchrun(tmp_path / "b", *common, "--batch-size", "64"))
    a, b = summary(tmp_path / "a"), summary(tmp_path / "b")
    assert a["steps"] == b["steps"] == 2048 // 2 // 64, (a, b)  # the task sized by its flags
    assert abs(a["final_loss"] - b["final_loss"]) < 1e-3, (a, b)


def test_user_task_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "mytask.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import TensorDataset
        from torchjob.trainer.tasks import Task

        def make():
            g = torch.Generator().manual_seed(0)
            x = torch.randn(512, 4, generator=g)
            y = (x[:, 0] > 0).long()
            model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 2))
            return Task(model, TensorDataset(x[:400], y[:400]), TensorDataset(x[400:], y[400:]))
    """))
    env = env_for_tests()
    run_ok(torchrun(tmp_path / "run", "--task", "mytask:make", "--epochs", "20",
                    "--warmup-steps", "0", "--lr", "0.01"),
           PYTHONPATH=f"{tmp_path}:{env['PYTHONPATH']}")
    assert summary(tmp_path / "run")["accuracy"] >= 0.9


def test_sync_bn_on_cpu_is_a_clear_config_error(tmp_path: Path) -> None:
    proc = subprocess.run(torchrun(tmp_path, "--sync-bn", "true", "--max-steps", "2"),
                          env=env_for_tests(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "--sync-bn needs GPU devices" in proc.stderr


def test_profile_writes_a_trace_per_rank_and_logs_the_busiest_operators(tmp_path: Path) -> None:
    """``--profile 3:5``: steps 3 to 5 under torch.profiler, each marked in every rank's
    Chrome trace; rank 0 logs its operator table (tests/trainer/test_profiling.py: the rest)."""
    proc = run_ok(torchrun(tmp_path, "--max-steps", "8", "--profile", "3:5",
                           "--checkpoint-every", "0"))
    assert "profile of steps 3-5" in proc.stderr and "Self CPU" in proc.stderr, \
        proc.stderr[-3000:]
    for rank in (0, 1):
        events = json.loads((tmp_path / "profile" / f"rank{rank}.json").read_text())
        names = {e.get("name", "") for e in events["traceEvents"]}
        assert {"ProfilerStep#3", "ProfilerStep#4"} <= names, sorted(names)[:20]
        assert sum(n == "Optimizer.step#AdamW.step" for n in
                   (e.get("name") for e in events["traceEvents"])) == 3

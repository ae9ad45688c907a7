"""SIGKILL of a worker to the next finished step (issue 13): ours (`torchjob run`: the agent
with preforked workers) against plain torchrun running the same trainer, alternating."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from common import ENV, PY, flags, median, row, stop, torchjob, wait_metric

ARGS = dict(log_every=1, progress="lines", checkpoint_every=10, epochs=30)


def worker_pids(root: int) -> list[int]:
    """The trainer's worker processes below ``root``: forked by our agent's server, or started
    by plain torchrun as ``python -u -m torchjob.trainer``."""
    from tests.procs import cmdline, descendants, trainer_workers
    return trainer_workers(root) or [pid for pid in descendants(root)
                                     if " -m torchjob.trainer " in cmdline(pid)]


def kill_to_next_step(cmd: list[str], run: Path) -> float:
    """Seconds from a SIGKILL of one worker (after step 25) to the first step the restarted
    group finishes (metrics.jsonl, ``restart`` >= 1)."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_metric(run, lambda r: r["kind"] == "train" and r["step"] >= 25, proc)
        victim = max(worker_pids(proc.pid))
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        rec = wait_metric(run, lambda r: r["kind"] == "train" and r.get("restart", 0) >= 1, proc)
        return rec["time"] - killed
    finally:
        stop(proc)


def run(quick: bool = False) -> list[dict]:
    trials = 5 if quick else 20
    ours, bare = [], []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            ours.append(kill_to_next_step(torchjob(Path(tmp), **ARGS), Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            bare.append(kill_to_next_step(
                # with the store setting we found necessary: plain torchrun hangs in its
                # second rendezvous without it (pytorch/pytorch#135712; trainer/agent.py)
                ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", PY, "-m",
                 "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "--max-restarts", "3", "--monitor-interval", "0.1", "-m", "torchjob.trainer",
                 "--run-dir", tmp, *flags(ARGS)], Path(tmp)))
    return [row("restart", "SIGKILL of a worker to the next step (median)",
                median(ours), median(bare), "ours <= 1.0 s", "s", trials=trials,
                torchjob_s=[round(g, 2) for g in ours], torchrun_s=[round(g, 2) for g in bare],
                torchjob_max_s=round(max(ours), 2))]

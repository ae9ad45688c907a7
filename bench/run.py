"""Benchmarks, each a ratio of two things measured side by side in this one run.

    .venv/bin/python bench/run.py            # all; writes bench/results/latest.json
    .venv/bin/python bench/run.py startup    # one of: throughput startup restart checkpoint accuracy

Targets (issue 2): trainer vs a minimal DDP loop >= 1.00x samples/s; `torchjob run` start to
first step <= 1.10x a bare torchrun; SIGKILL of a worker to the next step after restart
<= 1.0 s median over 20 trials (issue 13), plain torchrun's cycle beside it; asynchronous
checkpoint stall <= 10% of a synchronous one (state >= 100 MB); the default job's time to
95% accuracy. Nothing here is a pass/fail test: it reports.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
RESULTS = ROOT / "bench" / "results"


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def wait_metric(run_dir: Path, pred: Callable[[dict[str, Any]], bool], proc: subprocess.Popen,
                timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rec in metrics(run_dir):
            if pred(rec):
                return rec
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode} before the awaited metric")
        time.sleep(0.02)
    raise TimeoutError("metric never came")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def torchjob(run_dir: Path, job: str = "default.yaml", **args: Any) -> list[str]:
    sets = ["--set", f"run_dir={run_dir}"]
    for key, value in args.items():
        sets += ["--set", f"trainer.args.{key}={value}"]
    return [PY, "-m", "jobs", "run", str(ROOT / "jobs" / "examples" / job), *sets]


# -- 1. steady-state throughput ---------------------------------------------------------------

SYNTH = ["--task", "synthetic", "--batch-size", "64", "--epochs", "2", "--lr", "1e-3"]


def throughput(rounds: int = 3) -> dict[str, Any]:
    ours, base = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([PY, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", "2", "-m", "trainer", *SYNTH,
                            "--clip-grad", "0", "--schedule", "constant", "--warmup-steps", "0",
                            "--eval-every", "0", "--checkpoint-every", "0", "--progress",
                            "lines", "--log-every", "1000", "--run-dir", tmp],
                           env=ENV, check=True, capture_output=True)
            ours.append(json.loads((Path(tmp) / "summary.json").read_text())["samples_per_s"])
        out = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", "2", str(ROOT / "bench" / "minimal_ddp.py")],
                             env=ENV, check=True, capture_output=True, text=True).stdout
        base.append(json.loads(out.strip().splitlines()[-1])["samples_per_s"])
    ratio = statistics.median(ours) / statistics.median(base)
    return {"trainer_samples_per_s": ours, "minimal_ddp_samples_per_s": base,
            "ratio": round(ratio, 3), "target": ">= 1.00"}


# -- 2. start to first finished step ----------------------------------------------------------

def first_step_seconds(cmd: list[str], run_dir: Path) -> float:
    start = time.time()
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rec = wait_metric(run_dir, lambda r: r["kind"] == "train", proc)
    finally:
        stop(proc)
    return rec["time"] - start


def startup(rounds: int = 5) -> dict[str, Any]:
    ours, bare = [], []
    args = ["--log-every", "1", "--progress", "lines"]
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            ours.append(first_step_seconds(torchjob(Path(tmp), log_every=1, progress="lines"),
                                           Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            bare.append(first_step_seconds(
                [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "-m", "trainer", "--run-dir", tmp, *args], Path(tmp)))
    ratio = statistics.median(ours) / statistics.median(bare)
    return {"torchjob_run_s": [round(x, 2) for x in ours],
            "bare_torchrun_s": [round(x, 2) for x in bare], "ratio": round(ratio, 3),
            "target": "<= 1.10"}


# -- 3. SIGKILL to the next finished step -----------------------------------------------------

def worker_pids(root: int) -> list[int]:
    """The trainer's worker processes below ``root``: forked by our agent's server, or started
    by plain torchrun as ``python -u -m trainer``."""
    sys.path.insert(0, str(ROOT))
    from tests.procs import cmdline, descendants, trainer_workers
    return trainer_workers(root) or [pid for pid in descendants(root)
                                     if " -m trainer " in cmdline(pid)]


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


def restart(trials: int = 20) -> dict[str, Any]:
    """Ours (`torchjob run`: the agent with preforked workers) against plain torchrun running
    the same trainer, alternating, ``trials`` each."""
    args = dict(log_every=1, progress="lines", checkpoint_every=10, epochs=30)
    ours, bare = [], []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            ours.append(kill_to_next_step(torchjob(Path(tmp), **args), Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            flags = [w for k, v in args.items() for w in (f"--{k.replace('_', '-')}", str(v))]
            bare.append(kill_to_next_step(
                # with the store setting we found necessary: plain torchrun hangs in its
                # second rendezvous without it (pytorch/pytorch#135712; trainer/agent.py)
                ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "--max-restarts", "3", "--monitor-interval", "0.1", "-m", "trainer",
                 "--run-dir", tmp, *flags], Path(tmp)))
    return {"torchjob_kill_to_next_step_s": [round(g, 2) for g in ours],
            "torchrun_kill_to_next_step_s": [round(g, 2) for g in bare],
            "median_s": round(statistics.median(ours), 2), "max_s": round(max(ours), 2),
            "torchrun_median_s": round(statistics.median(bare), 2),
            "ratio": round(statistics.median(ours) / statistics.median(bare), 3),
            "target": "median <= 1.0 s over 20 trials"}


# -- 4. checkpoint stall ----------------------------------------------------------------------

def checkpoint(rounds: int = 3) -> dict[str, Any]:
    import torch

    from trainer.checkpoint import Checkpointer, Position
    from trainer.tasks import mlp
    torch.manual_seed(0)
    model = mlp(1024, 2048, 6, 10)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 1024)).sum().backward()
    opt.step()
    state_mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3 / 2**20
    stalls: dict[str, list[float]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        savers = {mode: Checkpointer(f"{tmp}/{mode}", rank=0, world_size=1, keep=1,
                                     async_save=mode == "async", sharded=False, config={},
                                     say=lambda m: None) for mode in stalls}
        for step in range(1, rounds + 2):
            for mode, ck in savers.items():
                t0 = time.perf_counter()
                ck.save(Position(step, 0, 0), model, opt)
                stalls[mode].append(time.perf_counter() - t0)
                ck.wait()  # the loop would go on; here the next save must not overlap
        for ck in savers.values():
            ck.close()
    # the first save of a run allocates the staging buffers; later ones reuse them
    ratio = statistics.median(stalls["async"][1:]) / statistics.median(stalls["sync"][1:])
    return {"state_mb": round(state_mb), "sync_stall_s": [round(s, 3) for s in stalls["sync"]],
            "async_stall_s": [round(s, 3) for s in stalls["async"]], "ratio": round(ratio, 3),
            "target": "<= 0.10"}


# -- 5. the default job's time to 95% accuracy ------------------------------------------------

def accuracy() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        start = time.time()
        subprocess.run(torchjob(run, progress="lines"), env=ENV, check=True,
                       capture_output=True)
        total = time.time() - start
        hit = next(r for r in metrics(run) if r["kind"] == "eval" and r["accuracy"] >= 0.95)
        summary = json.loads((run / "summary.json").read_text())
    return {"seconds_to_95pct": round(hit["time"] - start, 2), "at_epoch": hit["epoch"] + 1,
            "total_wall_s": round(total, 2), "final_accuracy": round(summary["accuracy"], 4)}


BENCHES = {"throughput": throughput, "startup": startup, "restart": restart,
           "checkpoint": checkpoint, "accuracy": accuracy}


def main() -> None:
    chosen = sys.argv[1:] or list(BENCHES)
    results = {}
    for name in chosen:
        print(f"== {name}", flush=True)
        results[name] = BENCHES[name]()
        print(json.dumps(results[name], indent=1), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "latest.json"
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), **results}, indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()

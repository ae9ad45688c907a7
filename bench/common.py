"""What every benchmark shares: paths, the environment, waiting on metrics, and the row.

A benchmark module exposes ``run(quick: bool = False) -> list[dict]``; each dict is one row of
the table (``row``): a measure, our figure, the baseline's figure measured side by side in the
same run, their ratio and the goal. ``detail`` (optional) keeps the raw samples.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
RESULTS = ROOT / "bench" / "results"
TORCHRUN = str(Path(PY).parent / "torchrun")


def row(benchmark: str, measure: str, ours: float, baseline: float | None, goal: str,
        unit: str, ratio: float | None = None, device: str | None = None,
        **detail: Any) -> dict[str, Any]:
    """One line of the table. ``ratio`` is ours / baseline unless given (a goal on ours
    alone, e.g. an accuracy, has no baseline and no ratio); ``device``: what it ran on."""
    if ratio is None and baseline:
        ratio = ours / baseline
    out: dict[str, Any] = {"benchmark": benchmark, "measure": measure, "ours": rnd(ours),
                           "baseline": rnd(baseline), "ratio": rnd(ratio, 3), "goal": goal,
                           "unit": unit}
    if device:
        out["device"] = device
    if detail:
        out["detail"] = detail
    return out


def rnd(x: float | None, digits: int = 4) -> float | None:
    if x is None:
        return None
    return float(f"{x:.{digits}g}")


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


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


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def torchjob(run_dir: Path, job: str = "default.yaml", *sets: str, **args: Any) -> list[str]:
    """``torchjob run`` of an example job, its run directory at ``run_dir``; ``args`` are
    trainer options, ``sets`` further ``--set`` values (``nnodes=4``)."""
    argv = ["--set", f"run_dir={run_dir}"]
    for item in sets:
        argv += ["--set", item]
    for key, value in args.items():
        argv += ["--set", f"trainer.args.{key}={value}"]
    return [PY, "-m", "torchjob.jobs", "run", str(ROOT / "jobs" / "examples" / job), *argv]


def output(cmd: list[str], timeout: float | None = None) -> str:
    """``cmd``'s stdout (environment ``ENV``); when it fails, an error with its stderr's tail."""
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {done.returncode}:\n{tail}")
    return done.stdout


def torchrun(nproc: int, *args: str) -> list[str]:
    """Bare torchrun on this host, ``nproc`` processes (as a module: the interpreter may have
    no ``torchrun`` script beside it)."""
    return [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            *args]


def flags(args: dict[str, Any]) -> list[str]:
    """Trainer options as command-line flags (``log_every=1`` -> ``--log-every 1``)."""
    return [w for k, v in args.items() for w in (f"--{k.replace('_', '-')}", str(v))]


def interleaved(rounds: int, ours: Callable[[], Any], baseline: Callable[[], Any],
                say: Callable[[Any, Any], str]) -> tuple[list[Any], list[Any]]:
    """``ours()`` and ``baseline()`` ``rounds`` times each, side by side, the first of each
    round alternating (a load that rises or falls on a shared machine favours neither); after
    each round prints ``say(ours' result, the baseline's)``. Both lists of results."""
    mine: list[Any] = []
    base: list[Any] = []
    for r in range(rounds):
        sides = [(ours, mine), (baseline, base)]
        for measure, results in sides if r % 2 == 0 else sides[::-1]:
            results.append(measure())
        print(f"  round {r + 1}: {say(mine[-1], base[-1])}", flush=True)
    return mine, base


def standalone(run: Callable[..., list[dict[str, Any]]], doc: str | None) -> None:
    """A benchmark module run as a script: ``--quick``, ``--device``; its rows as JSON."""
    import argparse

    from device import CHOICES
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--device", choices=CHOICES, default="cpu")
    args = ap.parse_args()
    print(json.dumps(run(quick=args.quick, device=args.device), indent=1))

"""The default job (jobs/examples/default.yaml, as is: digits, 2 processes, 12 epochs, an
evaluation after every epoch, a checkpoint every 50 steps): time to 95% test accuracy and its
final accuracy. Beside it, the same recipe as bench/minimal_ddp.py (bare torchrun, the same
model, data order, optimizer and schedule; rank 0 scores the test set after every epoch).
Both are timed from the command's start to the wall-clock time of the first evaluation at or
above 95%; rounds alternate which side goes first; medians.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from common import ENV, ROOT, TORCHRUN, interleaved, median, metrics, row, torchjob

TARGET = 0.95


def ours() -> tuple[float, float, int]:
    """(seconds to 95%, final accuracy, epochs to 95%)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        start = time.time()
        subprocess.run(torchjob(run, progress="lines"), env=ENV, check=True,
                       capture_output=True, timeout=900)
        evals = [r for r in metrics(run) if r["kind"] == "eval"]
        final = json.loads((run / "summary.json").read_text())["accuracy"]
    hit = next((r for r in evals if r["accuracy"] >= TARGET), None)
    if hit is None:
        return float("nan"), final, 0
    return hit["time"] - start, final, hit["epoch"] + 1


def baseline() -> tuple[float, float, int]:
    start = time.time()
    out = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2",
                          str(ROOT / "bench" / "minimal_ddp.py"), "--eval"],
                         env=ENV, check=True, capture_output=True, text=True,
                         timeout=900).stdout
    evals = [json.loads(line) for line in out.splitlines() if '"accuracy"' in line]
    hit = next((r for r in evals if r["accuracy"] >= TARGET), None)
    if hit is None:
        return float("nan"), evals[-1]["accuracy"], 0
    return hit["time"] - start, evals[-1]["accuracy"], hit["epoch"] + 1


def run(quick: bool = False) -> list[dict]:
    rounds = 1 if quick else 3
    mine, base = interleaved(rounds, ours, baseline,
                             lambda m, b: f"torchjob {m}, minimal DDP {b}")
    return [
        row("accuracy", "default job: start to 95% test accuracy (median)",
            median([m[0] for m in mine]), median([b[0] for b in base]), "report", "s",
            torchjob_s=[round(m[0], 2) for m in mine], minimal_ddp_s=[round(b[0], 2) for b in base],
            torchjob_epochs_to_95=[m[2] for m in mine],
            minimal_ddp_epochs_to_95=[b[2] for b in base]),
        row("accuracy", "default job: final test accuracy (median)",
            median([m[1] for m in mine]), median([b[1] for b in base]), "ours >= 0.95",
            "fraction", torchjob=[round(m[1], 4) for m in mine],
            minimal_ddp=[round(b[1], 4) for b in base]),
    ]

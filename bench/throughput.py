"""Steady-state samples/s: the trainer, as ``torchjob run`` runs it, vs bench/minimal_ddp.py,
a hand-written DDP loop with the same model, data, optimizer (fused AdamW), DDP options
(gradient_as_bucket_view), clipping, schedule and precision, under bare torchrun.

Task: digits (the default job's), 2 processes, batch 32 per rank, 30 epochs (660 steps);
the trainer evaluates and checkpoints only at the end (``eval_every 0``, ``checkpoint_every
0``), outside its clock, as the baseline does neither. Both sides count samples/s from the
end of step 5 to the end of the last step. Rounds alternate which side goes first; medians.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from common import ENV, ROOT, TORCHRUN, interleaved, median, row, torchjob

EPOCHS = 30  # a window of ~10 s: at 15 epochs one run's rate varied by 20% here
ARGS = dict(epochs=EPOCHS, eval_every=0, checkpoint_every=0, progress="lines")


def ours() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(torchjob(Path(tmp), **ARGS), env=ENV, check=True, capture_output=True,
                       timeout=900)
        return float(json.loads((Path(tmp) / "summary.json").read_text())["samples_per_s"])


def baseline() -> float:
    out = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2",
                          str(ROOT / "bench" / "minimal_ddp.py"), "--epochs", str(EPOCHS)],
                         env=ENV, check=True, capture_output=True, text=True,
                         timeout=900).stdout
    return float(json.loads(out.strip().splitlines()[-1])["samples_per_s"])


def run(quick: bool = False) -> list[dict]:
    rounds = 3 if quick else 5
    mine, base = interleaved(rounds, ours, baseline, lambda m, b: (
        f"trainer {m:.0f}, minimal DDP {b:.0f} samples/s"))
    return [row("throughput", "digits samples/s, 2 ranks (median)", median(mine),
                median(base), ">= 1.00", "samples/s",
                trainer=[round(x) for x in mine], minimal_ddp=[round(x) for x in base])]

"""Steady-state samples/s: the trainer, as ``torchjob run`` runs it, vs bench/minimal_ddp.py,
a hand-written DDP loop with the same model, data, optimizer (fused AdamW), DDP options
(gradient_as_bucket_view), clipping, schedule and precision, under bare torchrun. Two rows:
against the loop as written (DDP broadcasts the batch-norm statistics every forward, its
default; the trainer does not, trainer.parallel), and against the same loop without that
broadcast, which leaves only what the kit adds per step (its second row, a report).

Task: digits (the default job's), 2 processes, batch 32 per rank, 30 epochs (660 steps);
the trainer evaluates and checkpoints only at the end (``eval_every 0``, ``checkpoint_every
0``), outside its clock, as the baseline does neither. Both sides count samples/s from the
end of step 5 to the end of the last step. Rounds rotate which of the three goes first; medians.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from common import ENV, ROOT, TORCHRUN, median, row, torchjob

EPOCHS = 30  # a window of ~10 s: at 15 epochs one run's rate varied by 20% here
ARGS = dict(epochs=EPOCHS, eval_every=0, checkpoint_every=0, progress="lines")


def ours() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(torchjob(Path(tmp), **ARGS), env=ENV, check=True, capture_output=True,
                       timeout=900)
        return float(json.loads((Path(tmp) / "summary.json").read_text())["samples_per_s"])


def baseline(*extra: str) -> float:
    out = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2",
                          str(ROOT / "bench" / "minimal_ddp.py"), "--epochs", str(EPOCHS),
                          *extra], env=ENV, check=True, capture_output=True, text=True,
                         timeout=900).stdout
    return float(json.loads(out.strip().splitlines()[-1])["samples_per_s"])


def run(quick: bool = False) -> list[dict]:
    rounds = 3 if quick else 7
    mine: list[float] = []
    base: list[float] = []
    bare: list[float] = []  # the loop without DDP's per-forward buffer broadcast
    sides = [lambda: mine.append(ours()), lambda: base.append(baseline()),
             lambda: bare.append(baseline("--no-broadcast-buffers"))]
    for r in range(rounds):  # each first in turn: a load that rises or falls favours none
        for i in range(len(sides)):
            sides[(r + i) % len(sides)]()
        print(f"  round {r + 1}: trainer {mine[-1]:.0f}, minimal DDP {base[-1]:.0f}, "
              f"without the buffer broadcast {bare[-1]:.0f} samples/s", flush=True)
    return [row("throughput", "digits samples/s, 2 ranks (median)", median(mine),
                median(base), ">= 1.00", "samples/s",
                trainer=[round(x) for x in mine], minimal_ddp=[round(x) for x in base]),
            row("throughput", "the kit's cost: vs the loop also without DDP's buffer broadcast",
                median(mine), median(bare), "report", "samples/s",
                trainer=[round(x) for x in mine], minimal_ddp_no_broadcast=[
                    round(x) for x in bare])]

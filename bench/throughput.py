"""Steady-state samples/s: the trainer, as ``torchjob run`` runs it, vs bench/minimal_ddp.py,
a hand-written DDP loop with the same model, data, optimizer (fused AdamW), DDP options
(gradient_as_bucket_view), clipping, schedule and precision, under bare torchrun. Two rows:
against the loop as written (DDP broadcasts the batch-norm statistics every forward, its
default; the trainer does not, torchjob.trainer.parallel), and against the same loop without that
broadcast, which leaves only what the kit adds per step (its second row, a report).

Task: digits (the default job's), 2 processes, batch 32 per rank, 30 epochs (660 steps);
the trainer evaluates and checkpoints only at the end (``eval_every 0``, ``checkpoint_every
0``), outside its clock, as the baseline does neither. Both sides count samples/s from the
end of step 5 to the end of the last step. Rounds rotate which of the three goes first; medians.
``--device cuda``: one process per GPU, the trainer with ``--backend nccl``, the loop on
cuda:LOCAL_RANK with nccl; both in bf16 autocast (``--precision auto``); with one GPU neither
uses DDP, so the second row is left out. Each side's peak CUDA memory is in the row's detail
(no MFU: a convolution's FLOPs are not 6 per parameter). ``torchjob run`` finds its backends
as installed entry points: ``pip install -e .`` (``--no-deps`` offline) first.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import device as dev
from common import ROOT, median, output, row, standalone, torchjob, torchrun

EPOCHS = 30  # a window of ~10 s: at 15 epochs one run's rate varied by 20% here
ARGS = dict(epochs=EPOCHS, eval_every=0, checkpoint_every=0, progress="lines")
Run = tuple[float, Any]  # samples/s, max_memory_allocated (bytes; None on CPU)


def ours(device: str) -> Run:
    nproc, cuda = dev.processes(device), device == "cuda"
    sets = [f"nproc_per_node={nproc}"] if cuda else []
    with tempfile.TemporaryDirectory() as tmp:
        output(torchjob(Path(tmp), "default.yaml", *sets,
                        **ARGS, **({"backend": "nccl"} if cuda else {})), timeout=900)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return float(summary["samples_per_s"]), summary.get("max_memory_allocated")


def baseline(device: str, *extra: str) -> Run:
    out = output(torchrun(dev.processes(device), str(ROOT / "bench" / "minimal_ddp.py"),
                          "--epochs", str(EPOCHS), "--device", device, *extra), timeout=900)
    last = json.loads(out.strip().splitlines()[-1])
    return float(last["samples_per_s"]), last.get("max_memory_allocated")


def run(quick: bool = False, device: str = "cpu") -> list[dict]:
    dev.require(device)
    # quick on CUDA: 2 rounds, for gpt, throughput and checkpoint in ~4 minutes (bench/run.py)
    rounds, nproc = (3 if device == "cpu" else 2) if quick else 7, dev.processes(device)
    mine: list[Run] = []
    base: list[Run] = []
    bare: list[Run] = []  # the loop without DDP's per-forward buffer broadcast
    sides = [lambda: mine.append(ours(device)), lambda: base.append(baseline(device))]
    if nproc > 1:  # one process has no DDP and so no broadcast: that loop would be the same
        sides.append(lambda: bare.append(baseline(device, "--no-broadcast-buffers")))
    for r in range(rounds):  # each first in turn: a load that rises or falls favours none
        for i in range(len(sides)):
            sides[(r + i) % len(sides)]()
        print(f"  round {r + 1}: trainer {mine[-1][0]:.0f}, minimal DDP {base[-1][0]:.0f}"
              + (f", without the buffer broadcast {bare[-1][0]:.0f}" if bare else "")
              + " samples/s", flush=True)
    on = "" if device == "cpu" else f", {device}"
    rows = [row("throughput", f"digits samples/s, {nproc} rank{'s' * (nproc > 1)} "
                f"(median{on})", median([x for x, _ in mine]), median([x for x, _ in base]),
                ">= 1.00", "samples/s", device=dev.name(device), trainer=side(mine),
                minimal_ddp=side(base))]
    if bare:
        rows.append(row("throughput", "the kit's cost: vs the loop also without DDP's buffer "
                        f"broadcast{on}", median([x for x, _ in mine]),
                        median([x for x, _ in bare]), "report", "samples/s",
                        device=dev.name(device), trainer=side(mine),
                        minimal_ddp_no_broadcast=side(bare)))
    return rows


def side(runs: list[Run]) -> dict[str, Any]:
    """A side's samples/s of each run and its peak CUDA memory (None on CPU)."""
    memory = [m for _, m in runs if m]
    return {"samples_per_s": [round(x) for x, _ in runs],
            "max_memory_allocated": max(memory) if memory else None}


if __name__ == "__main__":
    standalone(run, __doc__)

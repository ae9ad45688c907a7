"""Benchmarks of ``--task gpt``: tokens/s of the trainer against two baselines, each pair run
side by side in this one run, interleaved round by round, medians compared.

    .venv/bin/python bench/gpt.py            # 5 rounds; --quick: fewer rounds and steps
    python3 bench/gpt.py --device cuda --shape gpt2-small --compile --quick

1. the trainer (``python -m torchjob.trainer --task gpt`` under torchrun) against a minimal
   hand-written DDP loop with the same model, data, optimizer and precision
   (bench/minimal_gpt.py); goal >= 1.00x;
2. the same trainer run against a nanoGPT-style single-file loop of the same model size on the
   same bytes (bench/nanogpt_loop.py); goal >= 1.00x;
3. ``--compile``: the trainer with ``--compile true`` against the minimal loop compiled too.

``--device cpu`` (default): 2 processes, gloo, fp32. ``--device cuda``: one process per GPU,
nccl, bf16 autocast. ``--shape example`` (default on CPU) is the example job's model
(jobs/examples/gpt.yaml: 4 blocks x 128 wide, 64 bytes of context, 16 windows per process and
step); ``gpt2-small`` (default on CUDA) is 12 blocks x 768 wide, 12 heads, 1024 of context,
16 windows per process. Each figure is tokens/s after 5 warm-up steps, from rank 0. Each side
also reports its MFU (6N, and with attention as nanoGPT's ``estimate_mfu``) against the peak
measured here (bench/device.py) and its peak CUDA memory. Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import device as dev  # noqa: E402
from common import ROOT, interleaved, median, output, rnd, row, torchrun  # noqa: E402


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    width: int
    context: int
    batch: int  # windows per process and step


SHAPES = {"example": Shape(4, 4, 128, 64, 16), "gpt2-small": Shape(12, 12, 768, 1024, 16)}
WARMUP = 5  # steps before the clock starts, as the trainer's summary (torchjob.trainer.clock)


def last_json(cmd: list[str]) -> dict[str, Any]:
    return json.loads(output(cmd).strip().splitlines()[-1])


class Sides:
    """The three programs at one shape on one device; each call returns one run's result,
    ``{"tokens_per_s", "max_memory_allocated"}`` and, for the baselines, ``"params"``."""

    def __init__(self, device: str, shape: str, steps: int) -> None:
        self.device, self.shape_name, self.shape, self.steps = device, shape, SHAPES[shape], steps
        self.nproc = dev.processes(device)

    def trainer(self, compile: bool = False) -> dict[str, Any]:
        s = self.shape
        cuda = ["--backend", "nccl"] if self.device == "cuda" else []
        compiled = ["--compile", "true"] if compile else []
        with tempfile.TemporaryDirectory() as tmp:
            output(torchrun(
                self.nproc, "-m", "torchjob.trainer", "--task", "gpt",
                 "--gpt-layers", str(s.layers),
                "--gpt-heads", str(s.heads), "--gpt-width", str(s.width), "--gpt-context",
                str(s.context), "--batch-size", str(s.batch), "--max-steps", str(self.steps),
                "--eval-every", "0", "--checkpoint-every", "0", "--progress", "lines",
                "--log-every", "1000", "--run-dir", tmp, *cuda, *compiled))
            summary = json.loads((Path(tmp) / "summary.json").read_text())
        return {"tokens_per_s": float(summary["tokens_per_s"]),
                "max_memory_allocated": summary.get("max_memory_allocated")}

    def minimal(self, compile: bool = False) -> dict[str, Any]:
        s = self.shape
        return last_json(torchrun(
            self.nproc, str(ROOT / "bench" / "minimal_gpt.py"), "--layers", str(s.layers),
            "--heads", str(s.heads), "--width", str(s.width), "--context", str(s.context),
            "--batch-size", str(s.batch), "--steps", str(self.steps), "--warmup", str(WARMUP),
            "--device", self.device, *(["--compile"] if compile else [])))

    def nanogpt(self) -> dict[str, Any]:
        s = self.shape
        return last_json(torchrun(
            self.nproc, str(ROOT / "bench" / "nanogpt_loop.py"), "--n-layer", str(s.layers),
            "--n-head", str(s.heads), "--n-embd", str(s.width), "--block-size", str(s.context),
            "--batch-size", str(s.batch), "--max-iters", str(self.steps), "--warmup",
            str(WARMUP), "--device", self.device))

    def side(self, runs: list[dict[str, Any]], params: int) -> dict[str, Any]:
        """One side's figures: its runs' tokens/s, the median's MFU both ways, peak memory."""
        s, rate = self.shape, median([r["tokens_per_s"] for r in runs])
        flops = dev.flops_per_token(params, s.layers, s.width, s.context)
        memory = [r["max_memory_allocated"] for r in runs if r.get("max_memory_allocated")]
        return {"tokens_per_s": [round(r["tokens_per_s"]) for r in runs], "params": params,
                **{f"mfu {k}": round(dev.mfu(rate, f, self.device, self.nproc), 4)
                   for k, f in flops.items()},
                "max_memory_allocated": max(memory) if memory else None}

    def row(self, benchmark: str, ours: tuple[str, list[dict[str, Any]]],
            base: tuple[str, list[dict[str, Any]]], params: int) -> dict[str, Any]:
        """A row of ``(name, runs)`` of ours and of the baseline; ``params``: the trainer's."""
        measure = "tokens/s, median of interleaved runs" + (
            "" if self.shape_name == "example" else f" ({self.shape_name})")
        sides: dict[str, Any] = {ours[0]: self.side(ours[1], params),
                                 base[0]: self.side(base[1], base[1][0]["params"])}
        return row(benchmark, measure, median([r["tokens_per_s"] for r in ours[1]]),
                   median([r["tokens_per_s"] for r in base[1]]), ">= 1.00", "tokens/s",
                   device=dev.name(self.device), processes=self.nproc, shape=self.shape_name,
                   peak_flops_per_device=rnd(dev.peak_flops(self.device)), **sides)


def say(name: str, side: dict[str, Any]) -> str:
    memory = side["max_memory_allocated"]
    return (f"{name}: {median(side['tokens_per_s']):.0f} tokens/s, MFU {side['mfu 6N']:.1%} (6N) "
            f"{side['mfu with attention']:.1%} (with attention)"
            + (f", peak memory {memory / 2**30:.2f} GiB" if memory else ""))


def run(quick: bool = False, device: str = "cpu", shape: str = "", compile: bool = False
        ) -> list[dict]:
    dev.require(device)
    if shape and shape not in SHAPES:
        raise ValueError(f"--shape {shape!r}: choose from {', '.join(SHAPES)}")
    if device == "cpu":  # 120 steps: a ~10 s window; at 60 (~5 s) a run's rate varied by 25%
        rounds, steps = (1, 30) if quick else (5, 120)
    else:
        # quick: ~2 minutes on one H100 (each run is ~20 s, mostly start-up and the end's save)
        rounds, steps = (2, WARMUP + 40) if quick else (5, WARMUP + 120)
    sides = Sides(device, shape or ("example" if device == "cpu" else "gpt2-small"), steps)
    print(f"  {dev.name(device)}, {sides.nproc} process(es), peak "
          f"{dev.peak_flops(device) / 1e12:.3g} TFLOP/s each", flush=True)
    ours: list[dict[str, Any]] = []
    base: dict[str, list[dict[str, Any]]] = {"minimal": [], "nanogpt": []}
    runs: list[Callable[[], None]] = [lambda: ours.append(sides.trainer()),
                                      lambda: base["minimal"].append(sides.minimal()),
                                      lambda: base["nanogpt"].append(sides.nanogpt())]
    for r in range(rounds):  # interleaved, each first in turn: a load that rises or falls
        for i in range(len(runs)):  # during a round (a shared machine) favours none of them
            runs[(r + i) % len(runs)]()
    params = base["minimal"][0]["params"]  # the trainer's model is the minimal loop's
    rows = [sides.row("gpt trainer vs minimal DDP loop", ("trainer", ours),
                      ("minimal_loop", base["minimal"]), params),
            sides.row("gpt trainer vs nanoGPT-style loop", ("trainer", ours),
                      ("nanogpt_loop", base["nanogpt"]), params)]
    if compile:  # a compile takes a minute or so per run on a GPU: there, 200 steps measured
        # (~6 s at GPT-2-small on an H100) cost little more and read the rate over a window
        # five times the quick runs' ~1 s
        long = Sides(device, sides.shape_name, WARMUP + 200) if device == "cuda" else sides
        mine, theirs = interleaved(1 if quick else rounds, lambda: long.trainer(compile=True),
                                   lambda: long.minimal(compile=True), lambda o, b: (
                                       f"trainer --compile true {o['tokens_per_s']:.0f}, "
                                       f"compiled minimal loop {b['tokens_per_s']:.0f} tokens/s"))
        rows.append(sides.row("gpt trainer --compile true vs compiled minimal loop",
                              ("trainer_compiled", mine), ("minimal_loop_compiled", theirs),
                              params))
    for done in rows:
        print(f"  {done['benchmark']}: " + "; ".join(
            say(k, v) for k, v in done["detail"].items() if isinstance(v, dict)), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    ap.add_argument("--device", choices=dev.CHOICES, default="cpu")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="",
                    help="the model (default: example on cpu, gpt2-small on cuda)")
    ap.add_argument("--compile", action="store_true",
                    help="add the trainer with --compile true vs the minimal loop compiled")
    args = ap.parse_args()
    rows = run(args.quick, args.device, args.shape, args.compile)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""The straggler report of the run summary: each rank's own work per step, and the ranks slower
than the median rank by more than ``MARGIN``.

A step's own work runs from the end of the previous optimizer step to the start of its last
backward (under DDP the rest waits for the slowest rank); on a GPU it is host time (kernels
queued). This attempt's steps only. What it leaves out, and why: docs/internals.md.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

MARGIN = 0.2  # a rank whose median step is 20% above the median rank's is a straggler


def percentiles(seconds: list[float]) -> dict[str, float]:
    """``{"steps", "p50_ms", "p90_ms", "max_ms"}`` (nearest-rank percentiles; 0 steps: zeros)."""
    if not seconds:
        return {"steps": 0, "p50_ms": 0.0, "p90_ms": 0.0, "max_ms": 0.0}
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return round(1000 * ordered[max(math.ceil(q * len(ordered)) - 1, 0)], 3)

    return {"steps": len(ordered), "p50_ms": at(0.5), "p90_ms": at(0.9),
            "max_ms": round(1000 * ordered[-1], 3)}


def report(per_rank: list[dict[str, float]], margin: float = MARGIN) -> dict[str, Any]:
    """From every rank's ``percentiles`` (index = rank): the summary's ``step_work``."""
    medians = [r["p50_ms"] for r in per_rank if r["steps"]]
    median = statistics.median(medians) if medians else 0.0
    slow = [rank for rank, r in enumerate(per_rank)
            if r["steps"] and median > 0 and r["p50_ms"] > (1 + margin) * median]
    return {"measure": "per-step time before the gradient all-reduce (data, forward)",
            "ranks": {str(rank): r for rank, r in enumerate(per_rank)},
            "median_p50_ms": round(median, 3), "margin": margin, "stragglers": slow}


def line(work: dict[str, Any]) -> str:
    """One line for the log: the stragglers named, or none."""
    median, margin = work["median_p50_ms"], work["margin"]
    if not work["stragglers"]:
        return (f"stragglers: none (no rank's median step work more than {margin:.0%} above "
                f"the median rank's {median:.1f} ms)")
    slow = ", ".join(f"rank {rank} (p50 {work['ranks'][str(rank)]['p50_ms']:.1f} ms, "
                     f"+{work['ranks'][str(rank)]['p50_ms'] / median - 1:.0%})"
                     for rank in work["stragglers"])
    return (f"stragglers: {slow}: slower than the median rank's {median:.1f} ms by more than "
            f"{margin:.0%}")

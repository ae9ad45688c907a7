"""Where a profiled step's time goes, from torch.profiler Chrome traces (the trainer's and the
minimal loop's ``--profile``; scripts/gpu-checks profile): per trace, the steps' wall time,
how busy the device was over them (the union of its kernels and copies), its kernel count, the
host's synchronising calls, the compiled graphs it ran, and the busiest kernels (on CPU:
operators, nested). A step that is slower with the same device time waits for the host; one
with more device time runs other kernels.

    python3 bench/trace_summary.py NAME=TRACE.json [NAME=TRACE.json ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "cudaMemcpy")  # a cudaMemcpy without Async waits for the stream's queued work
TOP = 8


def union(spans: list[tuple[float, float]]) -> float:
    """The time covered by ``spans`` (start, end), overlaps counted once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one trace's profiled steps (microseconds)."""
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("no ProfilerStep# spans: not a trace of torch.profiler's schedule")
    begin = min(e["ts"] for e in steps)
    end = max(e["ts"] + e["dur"] for e in steps)
    device = [e for e in events if e.get("cat") in DEVICE and "dur" in e]
    ops = device or [e for e in events if e.get("cat") == "cpu_op" and "dur" in e]
    busy = union([(e["ts"], e["ts"] + e["dur"]) for e in device])
    by_name: Counter[str] = Counter()
    for e in ops:
        by_name[e["name"][:70]] += e["dur"]
    syncs = Counter(e["name"] for e in events
                    if e.get("cat") == "cuda_runtime" and e.get("name") in SYNCS)
    graphs = sorted({e["name"].split()[3][:12] for e in events
                     if str(e.get("name", "")).startswith("## Call CompiledFxGraph")})
    return {"steps": len(steps), "step_ms": (end - begin) / len(steps) / 1e3, "graphs": graphs,
            "device_busy_ms": busy / len(steps) / 1e3 if device else None,
            "kernels_per_step": len([e for e in device if e.get("cat") == "kernel"]) / len(steps),
            "syncs": dict(syncs), "top": by_name.most_common(TOP)}


def show(name: str, s: dict[str, Any]) -> str:
    lines = [f"{name}: {s['steps']} steps, {s['step_ms']:.2f} ms per step"]
    if s["device_busy_ms"] is not None:
        lines[0] += (f", device busy {s['device_busy_ms']:.2f} ms "
                     f"({s['device_busy_ms'] / s['step_ms']:.0%}), "
                     f"{s['kernels_per_step']:.0f} kernels per step, synchronising calls "
                     f"{s['syncs'] or 'none'}")
    if s["graphs"]:  # the same names on both sides: inductor compiled the same graphs
        lines.append(f"    compiled graphs run: {', '.join(s['graphs'])}")
    total = sum(us for _, us in s["top"]) or 1.0
    lines += [f"    {us / s['steps'] / 1e3:8.3f} ms/step  {us / total:4.0%}  {op}"
              for op, us in s["top"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for arg in argv:
        name, path = arg.split("=", 1)
        try:
            with open(path) as file:
                data = json.load(file)
            events = data["traceEvents"] if isinstance(data, dict) else data
            print(show(name, summary(events)))
        except (OSError, ValueError, KeyError) as exc:
            print(f"{name}: {path}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

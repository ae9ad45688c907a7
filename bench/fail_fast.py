"""How fast a job whose code raises fails: ``torchjob run`` as a ratio to bare ``torchrun`` for
the same script, measured side by side in this one run (issue 12: goal <= 1.2x).

    .venv/bin/python bench/fail_fast.py [ROUNDS]

The script: 2 processes over gloo; rank 1 raises ValueError at step 5. Paths, each round in
a rotating order, timed from the start of the command to its exit:
- ``torchrun``: ``torchrun --standalone --nproc-per-node 2 SCRIPT`` (its default: no restart);
- ``torchjob``: ``torchjob run SPEC`` on the local backend, ``max_restarts: 3`` (the default).
(Bare torchrun with ``--max-restarts 3`` retries the exception three times, and here it
hung in its second rendezvous within five rounds: not a path worth timing.) Reports medians
and ratios to ``torchrun``; writes bench/results/fail_fast.json. Not pass/fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ENV, PY, RESULTS, TORCHRUN, median, row  # noqa: E402

SCRIPT = """
import argparse, torch, torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
args, _ = parser.parse_known_args()
dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(args.steps):
    if dist.get_rank() == 1 and step == 5:
        raise ValueError(f"bad value at step {step}")
    dist.all_reduce(t)
dist.destroy_process_group()
"""


def timed(argv: list[str], cwd: Path) -> float:
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=False)
    took = time.monotonic() - started
    if proc.returncode != 1:
        raise SystemExit(f"{argv[:3]}: exit {proc.returncode}, expected 1\n{proc.stderr[-2000:]}")
    return took


def measure(rounds: int) -> dict[str, dict[str, float]]:
    work = Path(tempfile.mkdtemp(prefix="bench-fail-"))
    script = work / "fail.py"
    script.write_text(SCRIPT)
    spec = work / "fail.yaml"
    spec.write_text(f"name: fail\nnproc_per_node: 2\nrun_dir: {work / 'run'}\n"
                    f"trainer:\n  script: {script}\n")
    paths = {
        "torchrun": [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script)],
        "torchjob": [PY, "-m", "torchjob.jobs", "run", str(spec)],
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(paths[name], work))
    return {"seconds": times, "median_s": {name: median(ts) for name, ts in times.items()}}


def run(quick: bool = False) -> list[dict]:
    """bench/run.py's row: median seconds to exit, torchjob vs torchrun."""
    rounds = 3 if quick else 5
    got = measure(rounds)
    med = got["median_s"]
    return [row("fail_fast", "a raising script: start to exit 1 (median)",
                med["torchjob"], med["torchrun"], "<= 1.2", "s", rounds=rounds,
                torchjob_s=[round(t, 2) for t in got["seconds"]["torchjob"]],
                torchrun_s=[round(t, 2) for t in got["seconds"]["torchrun"]])]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    got = measure(rounds)
    medians = got["median_s"]
    result = {"rounds": rounds, "seconds": got["seconds"], "median_s": medians,
              "ratio_to_torchrun": {name: medians[name] / medians["torchrun"]
                                    for name in medians}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fail_fast.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'path':<18}{'median s':>10}{'x torchrun':>12}")
    for name in medians:
        print(f"{name:<18}{medians[name]:>10.2f}{result['ratio_to_torchrun'][name]:>12.2f}")


if __name__ == "__main__":
    main()

"""Submit-to-first-step latency on the local Slurm cluster: ``torchjob run --to slurm`` (and
``--to slurm:sbatch``) as a ratio to ``torchx run -s slurm`` of the same job, measured side by
side in this one run.

    bash slurm/devcluster up && .venv/bin/python bench/slurm.py [ROUNDS]

The job: the default trainer on 2 nodes x 2 processes (batch 16 per rank), 20 steps. Each
round submits it once per path, in a rotating order, and times from the start of the submitting
command to the first training step in metrics.jsonl; the next submission starts only after the
job has left the queue (and `torchjob run`, which blocks like srun, has returned). Paths, all
one torchrun agent per node with c10d rendezvous:
- ``run``: ``torchjob run --to slurm`` (submitit hands sbatch the rendered script);
- ``run-sbatch``: ``torchjob run --to slurm:sbatch`` (the same script on sbatch's stdin);
- ``torchx``: ``torchx run -s slurm jobs/backends/torchx/components.py:train -j 2x2``.
Reports medians and ratios (lower is faster); writes bench/results/slurm.json. Not pass/fail.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ENV, PY, RESULTS, ROOT, metrics  # noqa: E402  (bench/common.py)

TORCHX = str(Path(PY).parent / "torchx")
ARGS = {"batch_size": "16", "max_steps": "20", "log_every": "1", "progress": "lines"}
FIRST_STEP_TIMEOUT_S = 300
PATHS = ("torchx", "run", "run-sbatch")
RUN_TIMEOUT_S = 300  # `torchjob run` returns when the job has ended
BENCH_ENV = {**ENV, "PATH": f"{Path(PY).parent}:{ENV.get('PATH', '')}"}


def sets(name: str, run_dir: Path) -> list[str]:
    pairs = [f"name={name}", "nnodes=2", "nproc_per_node=2", f"run_dir={run_dir}",
             *(f"trainer.args.{k}={v}" for k, v in ARGS.items())]
    return [w for pair in pairs for w in ("--set", pair)]


def call(argv: list[str], cwd: Path) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=BENCH_ENV, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {proc.returncode}: "
                           f"{(proc.stdout + proc.stderr)[-2000:]}")
    return proc.stdout


RUNNING: list[subprocess.Popen[str]] = []  # `torchjob run` of the current round


def run_torchjob(backend: str) -> Callable[[str, Path], Path]:
    """``torchjob run --to BACKEND``: started, not waited for (it blocks until the job ends)."""
    def start(name: str, work: Path) -> Path:
        run_dir = work / name
        RUNNING.append(subprocess.Popen(
            [PY, "-m", "torchjob.jobs", "run", "--to", backend,
             str(ROOT / "jobs/examples/default.yaml"),
             *sets(name, run_dir)], cwd=ROOT, env=BENCH_ENV, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        return run_dir
    return start


def submit_torchx(name: str, work: Path) -> Path:
    args = [w for k, v in ARGS.items() for w in (f"--{k.replace('_', '-')}", v)]
    call([TORCHX, "run", "-s", "slurm", f"{ROOT}/jobs/backends/torchx/components.py:train", "-j", "2x2",
         "--name", name, "--", *args], work)
    return work / "runs" / name


SUBMIT: dict[str, Callable[[str, Path], Path]] = {
    "torchx": submit_torchx, "run": run_torchjob("slurm"),
    "run-sbatch": run_torchjob("slurm:sbatch")}


def finish_run() -> None:
    """Wait for `torchjob run` to return: 0, the job's own exit code."""
    while RUNNING:
        proc = RUNNING.pop()
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if code != 0:
            raise RuntimeError(f"torchjob run exited {code}: "
                               f"{(proc.stderr.read() if proc.stderr else '')[-2000:]}")


def queued(name: str) -> bool:
    out = subprocess.run(["squeue", "--noheader", "--name", name, "--format=%i"],
                         capture_output=True, text=True, env=BENCH_ENV, check=False).stdout
    return bool(out.strip())


def first_step_latency(path: str, work: Path) -> float:
    """Seconds from the submitting command's start to the first training step; then waits for
    the job to leave the queue (cancelling it if the first step never comes)."""
    name = f"bench-{path}-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    run_dir = SUBMIT[path](name, work)
    try:
        while not any(r.get("kind") == "train" for r in metrics(run_dir)):
            if time.monotonic() - started > FIRST_STEP_TIMEOUT_S:
                raise TimeoutError(f"{path}: no training step after {FIRST_STEP_TIMEOUT_S} s "
                                   f"(see {run_dir})")
            time.sleep(0.02)
        latency = time.monotonic() - started
    except BaseException:
        subprocess.run(["scancel", "--name", name], env=BENCH_ENV, check=False)
        for proc in RUNNING:
            proc.kill()
        raise
    deadline = time.monotonic() + FIRST_STEP_TIMEOUT_S
    while queued(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    if queued(name):
        subprocess.run(["scancel", "--name", name], env=BENCH_ENV, check=False)
    finish_run()
    return latency


def main(rounds: int = 3) -> dict[str, object]:
    if subprocess.run(["scontrol", "ping"], capture_output=True, env=BENCH_ENV,
                      check=False).returncode != 0:
        sys.exit("bench/slurm.py: no Slurm controller answers: run `bash slurm/devcluster up`")
    seconds: dict[str, list[float]] = {p: [] for p in PATHS}
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            for path in PATHS[i % 3:] + PATHS[:i % 3]:  # rotate who goes first
                seconds[path].append(round(first_step_latency(path, work), 2))
                print(f"round {i + 1}: {path} {seconds[path][-1]} s", file=sys.stderr)
    median = {p: round(statistics.median(v), 2) for p, v in seconds.items()}
    result: dict[str, object] = {
        "bench": "slurm submit-to-first-step latency (2 nodes x 2 processes, local devcluster)",
        "rounds": rounds, "seconds": seconds, "median_s": median,
        "ratio_to_torchx": {p: round(median[p] / median["torchx"], 3)
                            for p in ("run", "run-sbatch")},
        "note": "ratio < 1: faster than `torchx run -s slurm` of the same job"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "slurm.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 and re.fullmatch(r"\d+", sys.argv[1]) else 3
    print(json.dumps(main(count), indent=2))

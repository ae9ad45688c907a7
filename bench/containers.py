"""Container benchmark: image size, build time cold and warm, and container start to first
training step as a ratio to a local ``torchjob run`` of the same job, measured side by side.

    .venv/bin/python bench/containers.py            # writes bench/results/containers.json
    .venv/bin/python bench/run.py containers        # its rows in the table (no cold build)

Needs podman and the base image (``scripts/container-setup``; run as root). The image is built
from this checkout under a tag of the benchmark's own, ``TORCHJOB_BENCH_IMAGE`` (default
localhost/torchjob-bench:latest), never over localhost/torchjob:latest, which other runs on
the machine may be using; every container run here names it (``--set image=...``). The cold
build uses ``--no-cache`` under a scratch tag that is removed afterwards; the warm build is the
one ``scripts/container-setup image`` does (the layer cache makes it take seconds). Nothing
here is a pass/fail test: it reports.

Start to first step: ``torchjob run --to docker`` vs ``torchjob run`` (local agents) of the
default job at 2 nodes x 2 processes, from the command's start to the first training step in
metrics.jsonl, alternating. On the test host, every container shares one CPU cgroup
(``libpod_parent``, cpu.shares 1024) against the host's processes one by one (cgroup v1): when
the machine is busy, a container's processes get a fraction of the CPU a local process gets,
and the ratio grows with the load. ``host_load`` in the detail says how busy it was.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ENV, PY, RESULTS, ROOT, row, stop, wait_metric  # noqa: E402

IMAGE = os.environ.get("TORCHJOB_BENCH_IMAGE") or "localhost/torchjob-bench:latest"
SCRATCH = "localhost/torchjob-bench:cold"
SETUP = ROOT / "scripts" / "container-setup"
JOB = ROOT / "jobs" / "examples" / "default.yaml"


def podman(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def build_args() -> list[str]:
    """The build scripts/container-setup runs (its base image and torch pin)."""
    text = SETUP.read_text()
    base = text.split("BASE_IMAGE=${BASE_IMAGE:-", 1)[1].split("}", 1)[0]
    suite = text.split("SUITE=${SUITE:-", 1)[1].split("}", 1)[0]
    pin = text.split("TORCH_PIN=${TORCH_PIN:-", 1)[1].split("}", 1)[0]
    return ["--build-arg", f"BASE_IMAGE={base.replace('$SUITE', suite)}",
            "--build-arg", f"TORCH_PIN={pin}"]


def timed(argv: list[str], timeout: float = 3600) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - start


def image(cold_build: bool = True) -> dict[str, Any]:
    """Warm build (cache), then a cold one (--no-cache, scratch tag removed after)."""
    subprocess.run(["bash", str(SETUP), "all"], check=True, capture_output=True,
                   env={**os.environ, "IMAGE": IMAGE})  # up to date
    warm = [timed(["podman", "build", *build_args(), "-t", IMAGE, "."]) for _ in range(2)]
    out: dict[str, Any] = {}
    if cold_build:
        try:
            out["build_cold_s"] = round(timed(["podman", "build", "--no-cache", *build_args(),
                                               "-t", SCRATCH, "."]), 1)
            out["cold_build_image_mb"] = round(int(podman(
                "image", "inspect", "--format", "{{.Size}}", SCRATCH).stdout) / 1e6)
        finally:
            podman("rmi", "-f", SCRATCH)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    base = build_args()[1].split("=", 1)[1]
    base_size = int(podman("image", "inspect", "--format", "{{.Size}}", base).stdout)
    return {"image": IMAGE, "image_mb": round(size / 1e6), "base_image_mb": round(base_size / 1e6),
            "build_warm_s": [round(x, 1) for x in warm], **out}


def first_step(to: str) -> float:
    """Seconds from ``torchjob run --to TO`` to the first finished training step (2 nodes x 2
    processes), then stop it."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "runs" / "digits"
        argv = [PY, "-m", "torchjob.jobs", "run", "--to", to, str(JOB), "--set", "nnodes=2",
                "--set", f"image={IMAGE}", "--set", "trainer.args.max_steps=2",
                "--set", "trainer.args.log_every=1", "--set", "trainer.args.progress=lines"]
        start = time.time()
        proc = subprocess.Popen(argv, env=ENV, cwd=tmp, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            rec = wait_metric(run_dir, lambda r: r["kind"] == "train", proc, timeout=600)
        finally:
            stop(proc)
            proc.wait(timeout=300)
        return float(rec["time"]) - start


def startup(rounds: int = 3) -> dict[str, Any]:
    """Alternating rounds (which side first, too), so both sides see the same machine load."""
    docker: list[float] = []
    local: list[float] = []
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        for to in (("docker", "local") if r % 2 == 0 else ("local", "docker")):
            (docker if to == "docker" else local).append(first_step(to))
        load.append(os.getloadavg()[0])
        print(f"  round {r + 1}: docker {docker[-1]:.1f} s, local {local[-1]:.1f} s",
              flush=True)
    return {"docker_first_step_s": [round(x, 2) for x in docker],
            "local_first_step_s": [round(x, 2) for x in local],
            "ratio": round(statistics.median(docker) / statistics.median(local), 2),
            "host_load": [round(x, 1) for x in load],
            "job": "default.yaml, nnodes=2 x nproc_per_node=2 (containers vs local agents)"}


def run(quick: bool = False) -> list[dict]:
    """bench/run.py's rows: start to first step (docker vs local) and the image's size."""
    built = image(cold_build=False)
    got = startup(rounds=2 if quick else 3)
    return [row("containers", "start to first step, 2 nodes x 2 (docker vs local, median)",
                statistics.median(got["docker_first_step_s"]),
                statistics.median(got["local_first_step_s"]), "<= 1.2", "s", **got),
            row("containers", f"image size ({IMAGE})", built["image_mb"], None, "report",
                "MB", **built)]


def main() -> None:
    results = {"when": time.strftime("%Y-%m-%d %H:%M"), "image": image(), "startup": startup()}
    print(json.dumps(results, indent=1), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "containers.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()

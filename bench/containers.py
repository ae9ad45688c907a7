"""Container benchmark: image size, build time cold and warm, and container start to first
training step as a ratio to a local ``torchjob run`` of the same job, measured side by side.

    .venv/bin/python bench/containers.py            # writes bench/results/containers.json

Needs podman and the base image (``scripts/container-setup``; run as root). The cold build
uses ``--no-cache`` under a scratch tag that is removed afterwards; the warm build is the one
``scripts/container-setup image`` does (the layer cache makes it take seconds). Nothing here is
a pass/fail test: it reports.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ENV, PY, RESULTS, ROOT, stop, wait_metric  # noqa: E402

IMAGE = "localhost/torchjob:latest"
SCRATCH = "localhost/torchjob:bench-cold"
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


def image() -> dict[str, Any]:
    """Warm build (cache), then a cold one (--no-cache, scratch tag removed after)."""
    subprocess.run(["bash", str(SETUP), "all"], check=True, capture_output=True)  # up to date
    warm = [timed(["podman", "build", *build_args(), "-t", IMAGE, "."]) for _ in range(2)]
    try:
        cold = timed(["podman", "build", "--no-cache", *build_args(), "-t", SCRATCH, "."])
        cold_size = int(podman("image", "inspect", "--format", "{{.Size}}", SCRATCH).stdout)
    finally:
        podman("rmi", "-f", SCRATCH)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    base = build_args()[1].split("=", 1)[1]
    base_size = int(podman("image", "inspect", "--format", "{{.Size}}", base).stdout)
    return {"image_mb": round(size / 1e6), "cold_build_image_mb": round(cold_size / 1e6),
            "base_image_mb": round(base_size / 1e6), "build_cold_s": round(cold, 1),
            "build_warm_s": [round(x, 1) for x in warm]}


def first_step(to: str) -> float:
    """Seconds from ``torchjob run --to TO`` to the first finished training step (2 nodes x 2
    processes), then stop it."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "runs" / "digits"
        argv = [PY, "-m", "jobs", "run", "--to", to, str(JOB), "--set", "nnodes=2",
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
    """Alternating rounds, so both sides see the same machine load."""
    docker, local = [], []
    for _ in range(rounds):
        docker.append(first_step("docker"))
        local.append(first_step("local"))
    return {"docker_first_step_s": [round(x, 2) for x in docker],
            "local_first_step_s": [round(x, 2) for x in local],
            "ratio": round(statistics.median(docker) / statistics.median(local), 2),
            "job": "default.yaml, nnodes=2 x nproc_per_node=2 (containers vs local agents)"}


def main() -> None:
    results = {"when": time.strftime("%Y-%m-%d %H:%M"), "image": image(), "startup": startup()}
    print(json.dumps(results, indent=1), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "containers.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()

"""TorchX's local_docker scheduler runs this project's component through podman's
Docker-compatible API (no Docker engine runs here; podman serves the same API)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def test_torchx_local_docker_through_podman(container_image: str, tmp_path: Path) -> None:
    api = subprocess.run(["bash", str(ROOT / "scripts" / "container-setup"), "docker-api"],
                         capture_output=True, text=True, timeout=120)
    assert api.returncode == 0, api.stderr
    host = [line for line in api.stdout.splitlines() if line.startswith("DOCKER_HOST=")][-1]
    env = {**os.environ, "DOCKER_HOST": host.split("=", 1)[1],
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o777)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchx"), "run", "-s", "local_docker",
         "--workspace", "", f"{ROOT}/jobs/components.py:train", "-j", "1x2", "--name", "txd",
         "--image", container_image, "--mounts", f"type=bind,src={runs},dst=/workspace/runs",
         "--", "--epochs", "4"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "SUCCEEDED" in proc.stdout + proc.stderr
    summary = json.loads((runs / "txd" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["accuracy"] >= 0.95

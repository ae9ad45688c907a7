"""`torchx run -s kubernetes --dryrun` of the component prints the expected request, whole.

The scheduler's request is compared with a golden file after replacing the random app id
(regenerate with TORCHJOB_REGEN_GOLDEN=1).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.golden import assert_golden

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "torchx_kubernetes_2x2.yaml"


def test_kubernetes_dryrun_request_is_the_golden_one(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchx"), "run", "-s", "kubernetes", "--dryrun",
         "--workspace", "", "-cfg", "queue=default,namespace=default",
         f"{ROOT}/jobs/backends/torchx/components.py:train", "-j", "2x2", "--name", "digits", "--gpu", "2",
         "--", "--epochs", "3"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    request = proc.stdout.split("=== SCHEDULER REQUEST ===", 1)[1].strip() + "\n"
    app_id = re.search(r"^  name: (digits-\w+)$", request, re.MULTILINE)
    assert app_id, request
    request = request.replace(app_id.group(1), "APP_ID")
    assert_golden(request, GOLDEN)
    assert "nvidia.com/gpu: '2'" in request and "${TORCHX_RANK0_HOST:=localhost}:29400" in request


def test_torchjobs_kubernetes_requests_give_every_pod_the_stop_grace(tmp_path: Path) -> None:
    """TorchX's Role has no grace period (pods would get Kubernetes' 30 s): the backend sets the
    job's stop_grace on every pod of the request it renders and submits."""
    from tests.procs import env_for_tests, torchjob
    (tmp_path / ".torchxconfig").write_text("[kubernetes]\nqueue = default\n"
                                            "[kubernetes_mcad]\nnamespace = default\n")
    for scheduler in ("kubernetes", "kubernetes_mcad"):
        out = torchjob("render", "--to", f"torchx:{scheduler}",
                       f"{ROOT}/jobs/examples/default.yaml", "--set", "nnodes=3",
                       "--set", "stop_grace=77", cwd=tmp_path, env=env_for_tests())
        assert out.returncode == 0, out.stderr[-3000:]
        graces = re.findall(r"terminationGracePeriodSeconds: (\d+)", out.stdout)
        assert graces == ["77"] * 3, (scheduler, out.stdout)  # a pod per node

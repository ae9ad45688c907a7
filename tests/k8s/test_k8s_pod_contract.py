"""The pod contract for real: one podman container per replica, named and resolvable as the
operator names its pods, with the pod's image, command and env plus exactly the env the
PyTorchJob operator injects (shared/K8S-CONTRACT.md), the run directory a PVC (a host
directory) shared by the pods. Training must complete with the right world size, and the job
succeed as the operator judges it. (The operator itself cannot run here: tests/k8s/pods.py
emulates what it does with the pods; the conformance matrix's pod column runs on it too.)"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from jobs.load import load
from k8s.render import render_object
from tests.k8s.pods import leftovers, run
from tests.procs import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.containers]


@pytest.mark.parametrize("job_file, sets, pod_names, world", [
    ("default.yaml", ["nnodes=2"], ["master-0", "worker-0"], 4),
    ("elastic.yaml", [], ["worker-0", "worker-1"], 4),
])
def test_rendered_pods_train_with_the_operators_env(container_image: str, tmp_path: Path,
                                                   job_file: str, sets: list[str],
                                                   pod_names: list[str], world: int) -> None:
    name = f"pc-{secrets.token_hex(2)}"
    spec = load(ROOT / "jobs" / "examples" / job_file,
                [*sets, f"name={name}", "trainer.args.epochs=2", "image=" + container_image,
                 "k8s.pvc=runs", "k8s.pvc_mount_path=/workspace"])
    job = render_object(spec, "pytorchjob")
    code, pods = run(job, {"runs": tmp_path})
    logs = "\n".join(pods.logs_of(pod)[-3000:] for pod in pods.pods)
    assert [pod.name for pod in pods.pods] == [f"{name}-{p}" for p in pod_names], logs
    assert code == 0 and pods.why == "Succeeded", logs
    assert not leftovers(pods.token)
    summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
    assert summary["world_size"] == world and summary["accuracy"] >= 0.9, summary

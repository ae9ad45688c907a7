"""The pod contract for real: one podman container per replica, named and resolvable as the
operator names its pods, with the pod's image, command and env plus exactly the env the
PyTorchJob operator injects (shared/K8S-CONTRACT.md). Training must complete with the right
world size. (The operator itself cannot run here; this is what its pods would do.)"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jobs.load import load
from k8s.render import render_object
from tests.procs import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.containers]
OPERATOR_PORT = 23456  # pytorchjob-port


def injected(job: dict[str, Any], replica: str, index: int) -> dict[str, str]:
    """The env the operator appends to a replica's container (K8S-CONTRACT.md)."""
    name, spec = job["metadata"]["name"], job["spec"]
    specs = spec["pytorchReplicaSpecs"]
    nproc = spec.get("nprocPerNode", "auto")
    env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": nproc}
    if "elasticPolicy" in spec:
        policy = spec["elasticPolicy"]
        env.update({
            "PET_RDZV_ENDPOINT": f"{policy.get('rdzvHost', f'{name}-worker-0')}:"
                                 f"{policy.get('rdzvPort', OPERATOR_PORT)}",
            "PET_RDZV_BACKEND": policy.get("rdzvBackend", "c10d"),
            "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}"})
        if "maxRestarts" in policy:
            env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
        if "rdzvId" in policy:
            env["PET_RDZV_ID"] = policy["rdzvId"]
        return env
    pods = sum(r["replicas"] for r in specs.values())
    rank = index if replica == "Master" else index + ("Master" in specs)
    world = pods * int(nproc) if str(nproc).isdigit() else pods
    master = f"{name}-master-0"
    env.update({"MASTER_ADDR": master, "PET_MASTER_ADDR": master,
                "MASTER_PORT": str(OPERATOR_PORT), "PET_MASTER_PORT": str(OPERATOR_PORT),
                "RANK": str(rank), "PET_NODE_RANK": str(rank), "WORLD_SIZE": str(world),
                "PET_NNODES": str(pods)})
    return env


def run_pods(job: dict[str, Any], image: str, runs: Path) -> list[tuple[str, int, str]]:
    network = f"tj-{secrets.token_hex(3)}"
    subprocess.run(["podman", "network", "create", network], check=True, capture_output=True)
    names: list[str] = []
    try:
        for replica, rspec in job["spec"]["pytorchReplicaSpecs"].items():
            for index in range(rspec["replicas"]):
                (container,) = [c for c in rspec["template"]["spec"]["containers"]
                                if c["name"] == "pytorch"]
                env = {e["name"]: e["value"] for e in container.get("env", [])}
                env.update(injected(job, replica, index))
                pod = f"{job['metadata']['name']}-{replica.lower()}-{index}"
                user = rspec["template"]["spec"]["securityContext"]["runAsUser"]
                cmd = ["podman", "run", "-d", "--name", pod, "--hostname", pod,
                       "--network", network, "--user", str(user), "--shm-size", "1g",
                       "-v", f"{runs}:/workspace/runs"]
                for key, value in env.items():
                    cmd += ["-e", f"{key}={value}"]
                cmd += [container.get("image", image), *container.get("command", []),
                        *container.get("args", [])]
                subprocess.run(cmd, check=True, capture_output=True)
                names.append(pod)
        results = []
        for pod in names:
            code = subprocess.run(["podman", "wait", pod], capture_output=True, text=True,
                                  timeout=600).stdout.strip()
            logs = subprocess.run(["podman", "logs", pod], capture_output=True, text=True)
            results.append((pod, int(code), logs.stdout + logs.stderr))
        return results
    finally:
        subprocess.run(["podman", "rm", "-f", *names], capture_output=True)
        subprocess.run(["podman", "network", "rm", "-f", network], capture_output=True)


@pytest.mark.parametrize("job_file, sets, pods, world", [
    ("default.yaml", ["nnodes=2"], ["master-0", "worker-0"], 4),
    ("elastic.yaml", [], ["worker-0", "worker-1"], 4),
])
def test_rendered_pods_train_with_the_operators_env(container_image: str, tmp_path: Path,
                                                   job_file: str, sets: list[str],
                                                   pods: list[str], world: int) -> None:
    name = f"pc-{secrets.token_hex(2)}"
    spec = load(ROOT / "jobs" / "examples" / job_file,
                [*sets, f"name={name}", "trainer.args.epochs=2", "image=" + container_image])
    job = render_object(spec, "pytorchjob")
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o777)
    results = run_pods(job, container_image, runs)
    assert [r[0] for r in results] == [f"{name}-{p}" for p in pods]
    for pod, code, logs in results:
        assert code == 0, f"{pod} exited {code}:\n{logs[-3000:]}"
    summary = json.loads((runs / name / "summary.json").read_text())
    assert summary["world_size"] == world and summary["accuracy"] >= 0.9, summary

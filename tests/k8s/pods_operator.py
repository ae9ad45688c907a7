"""What the PyTorchJob operator (kubeflow/trainer release-1.9, shared/K8S-CONTRACT.md) does to
a job's pods before they run, for the pod emulator (``tests/k8s/pods.py``): the env it
appends to each replica's container, the init container it adds to Worker pods of a job with
a Master, and what a namespace enforcing Pod Security "restricted" then says of the pods. Pure.
"""

from __future__ import annotations

import copy
from typing import Any

from torchjob.k8s.validate import validate

OPERATOR_PORT = 23456  # pytorchjob-port, unless the container names a port so
INIT_IMAGE, INIT_TRIES = "alpine:3.10", 100  # the operator's defaults for its init container
Obj = dict[str, Any]


def injected(job: Obj, replica: str, index: int) -> dict[str, str]:
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
    env["PET_NNODES"] = str(pods)
    if "Master" not in specs:  # Worker-only: no MASTER_*, RANK, WORLD_SIZE, PET_NODE_RANK
        return env
    rank = index if replica == "Master" else index + 1
    world = pods * int(nproc) if str(nproc).isdigit() else pods
    master = f"{name}-master-0"
    env.update({"MASTER_ADDR": master, "PET_MASTER_ADDR": master,
                "MASTER_PORT": str(OPERATOR_PORT), "PET_MASTER_PORT": str(OPERATOR_PORT),
                "RANK": str(rank), "PET_NODE_RANK": str(rank), "WORLD_SIZE": str(world)})
    return env


def init_containers(job: Obj, replica: str) -> list[Obj]:
    """The init containers the operator appends to a replica's pods: with a Master, every
    Worker pod gets its default one (release-1.9 pkg/controller.v1/pytorch/initcontainer.go:
    image alpine:3.10, 100 tries; its ``--pytorch-init-container-template-file`` is the
    operator's, cluster-wide, so a job cannot count on another), which has no
    securityContext."""
    if replica != "Worker" or "Master" not in job["spec"]["pytorchReplicaSpecs"]:
        return []
    master = f"{job['metadata']['name']}-master-0"
    return [{"name": "init-pytorch", "image": INIT_IMAGE, "imagePullPolicy": "IfNotPresent",
             "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                           "requests": {"cpu": "50m", "memory": "10Mi"}},
             "command": ["sh", "-c", f"err=1;for i in $(seq {INIT_TRIES}); do if nslookup "
                         f"{master}; then err=0 && break; fi;echo waiting for master; sleep 2; "
                         "done; exit $err"]}]


def as_mutated(job: Obj) -> Obj:
    """The job with each replica's pod template as the operator creates its pods (its init
    containers appended): what a namespace's Pod Security admission sees."""
    out = copy.deepcopy(job)
    for replica, rspec in out["spec"]["pytorchReplicaSpecs"].items():
        pod = rspec["template"]["spec"]
        pod["initContainers"] = [*pod.get("initContainers", []), *init_containers(job, replica)]
        if not pod["initContainers"]:
            del pod["initContainers"]
    return out


def forbidden(objs: list[Obj]) -> list[str]:
    """Why a namespace enforcing Pod Security "restricted" refuses the pods of ``objs`` (the
    job's as the operator mutates them, the Deployments'); [] when it admits them all."""
    return [str(p) for obj in objs
            for p in validate(as_mutated(obj) if obj["kind"] == "PyTorchJob" else obj)
            if p.rule == "pod-security"]

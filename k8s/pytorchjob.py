"""The PyTorchJob renderer (``kubeflow.org/v1``): a JobSpec -> one manifest dict. Pure.

Every pod runs the agent command of ``jobs.command``, all of torchrun's flags written out (the
operator's ``PET_*`` agree). One node: a Master whose agent serves the c10d store. Several,
fixed or elastic: Worker-only pods that wait for, then meet at, the job's own store behind
``<job>-rdzv`` (k8s.store), checkpoints on a claim every pod mounts (k8s.pod). Why no Master:
docs/internals.md.
"""

from __future__ import annotations

from torchjob.jobs.command import agent_command
from torchjob.jobs.spec import JobSpec
from torchjob.k8s.pod import (WAIT_FOR_HOST, Obj, command_words, metadata, on_cluster, pod_spec,
                              shared_checkpoints)
from torchjob.k8s.store import has_store, store_name

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER = "pytorch"


def rdzv_host(spec: JobSpec) -> str:
    """The c10d store's host: the Master's agent (one node), or the job's own store Service."""
    return store_name(spec) if has_store(spec) else f"{spec.name}-master-0"


def command(spec: JobSpec, python: str = "python") -> list[str]:
    """The ``pytorch`` container's command (spec already placed on the cluster)."""
    host = rdzv_host(spec)
    agent = agent_command(spec, python=python, rdzv_endpoint=f"{host}:{spec.rdzv.port}",
                          run_id=spec.name, store_client=has_store(spec))
    if not has_store(spec):
        return list(agent)
    return [python, "-c", WAIT_FOR_HOST, f"{host}:{spec.rdzv.port}",
            str(spec.k8s.rdzv_wait_seconds), *agent]


def replica(spec: JobSpec, replicas: int) -> Obj:
    container: Obj = {"name": CONTAINER, "image": spec.image,
                      "command": command_words(command(spec))}
    if not has_store(spec):  # the Master's agent serves the store
        container["ports"] = [{"name": "c10d", "containerPort": spec.rdzv.port}]
    return {"replicas": replicas, "restartPolicy": spec.k8s.restart_policy,
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": spec.name}},
                         "spec": pod_spec(spec, container)}}


def run_policy(spec: JobSpec) -> Obj:
    k8s = spec.k8s
    out: Obj = {"cleanPodPolicy": k8s.clean_pod_policy}
    if k8s.backoff_limit is not None:
        out["backoffLimit"] = k8s.backoff_limit
    if k8s.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = k8s.ttl_seconds_after_finished
    if k8s.active_deadline_seconds is not None:
        out["activeDeadlineSeconds"] = k8s.active_deadline_seconds
    if k8s.volcano_queue:
        scheduling: Obj = {"minAvailable": spec.nnodes.min, "queue": k8s.volcano_queue}
        if k8s.priority_class:
            scheduling["priorityClass"] = k8s.priority_class
        out["schedulingPolicy"] = scheduling
    return out


def render_pytorchjob(spec: JobSpec) -> Obj:
    """The PyTorchJob for ``spec``: a Master (one node), or Workers (with elasticPolicy when
    elastic) beside the store of ``torchjob.k8s.store``."""
    spec = on_cluster(spec)
    nnodes = spec.nnodes
    shared_checkpoints(spec, nnodes.max)
    body: Obj = {"nprocPerNode": str(spec.nproc_per_node)}
    if nnodes.is_elastic:
        body["elasticPolicy"] = {"minReplicas": nnodes.min, "maxReplicas": nnodes.max,
                                 "rdzvBackend": spec.rdzv.backend,
                                 "rdzvHost": store_name(spec), "rdzvPort": spec.rdzv.port,
                                 "rdzvId": spec.name, "maxRestarts": spec.max_restarts}
        replicas = {"Worker": replica(spec, nnodes.max)}
    elif has_store(spec):  # no Master: no operator init container (docs/internals.md)
        replicas = {"Worker": replica(spec, nnodes.max)}
    else:
        replicas = {"Master": replica(spec, 1)}
    body["pytorchReplicaSpecs"] = replicas
    body["runPolicy"] = run_policy(spec)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(spec), "spec": body}

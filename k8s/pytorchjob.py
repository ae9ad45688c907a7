"""The PyTorchJob renderer (``kubeflow.org/v1``): a JobSpec -> one manifest dict. Pure.

Every pod runs, in the container ``pytorch``, the same agent command every backend runs
(``torchjob.jobs.command``), with all of torchrun's flags written out: the spec is the one source of
the topology, and a flag wins over the ``PET_*`` variable the operator injects. The operator
fields are set so that its ``PET_*`` agree anyway (``nprocPerNode``, ``elasticPolicy``).

- One node: a Master of one pod, whose agent serves the c10d store itself
  (``<job>-master-0:<rdzv.port>``), as torchrun does.
- Several nodes, fixed (``nnodes: N``) or elastic (``nnodes: MIN:MAX``): Worker-only (with
  ``elasticPolicy`` when elastic), c10d at ``<job>-rdzv:<rdzv.port>``, the job's own store in a
  pod of its own behind that Service (``k8s.store``): no pod hosts the rendezvous, so losing
  any one pod leaves it alive, and a lost store pod is recreated by its Deployment while the
  agents exit ``EXIT_STORE_LOST`` (>= 128: the ExitCode policy recreates their pods, which
  resume from the shared checkpoint). No Master also means no operator init container: the
  v1 operator adds one (alpine, waiting for ``<job>-master-0`` to resolve, with no
  securityContext) to every Worker pod of a job that has a Master, and a namespace enforcing
  Pod Security "restricted" rejects those pods. Instead the command first waits, as the pod's
  own restricted process, until the store answers at ``<job>-rdzv:<rdzv.port>`` (the Service
  is created with the job, but not necessarily before it, and a recreated store pod may take
  minutes), so pods neither crash-loop on DNS nor give up on a store that is coming back. Every agent is a client
  of the store (``is_host=false``); for an elastic job the operator's ``PET_RDZV_ENDPOINT``
  names it too (``rdzvHost``, ``rdzvPort``).
- Checkpoints: a job of several pods needs them on a claim every pod mounts
  (``torchjob.k8s.pod.shared_checkpoints``).
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
    elif has_store(spec):  # no Master: no operator init container (see the docstring)
        replicas = {"Worker": replica(spec, nnodes.max)}
    else:
        replicas = {"Master": replica(spec, 1)}
    body["pytorchReplicaSpecs"] = replicas
    body["runPolicy"] = run_policy(spec)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(spec), "spec": body}

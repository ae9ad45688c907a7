"""The rendezvous store of a PyTorchJob of several pods (fixed or elastic): a Deployment of one
store pod and the Service ``<job>-rdzv`` every agent meets at, beside the job. Pure."""

from __future__ import annotations

from torchjob.jobs.command import store_command
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import DNS_LABEL_MAX, bad
from torchjob.k8s.pod import Obj, command_words, container_security, pod_security

SUFFIX = "-rdzv"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "rendezvous"
CONTAINER = "store"
# What the store needs: a TCP server and an idle Python with torch imported (~230 MB resident).
REQUESTS = {"cpu": "100m", "memory": "256Mi"}
LIMITS = {"memory": "512Mi"}


def has_store(spec: JobSpec) -> bool:
    """Whether the job runs this store: every job of several pods (a one-pod job's agent
    serves its own). Wider than ``jobs.command.own_store`` (elastic jobs, on every backend): a
    fixed-size PyTorchJob with a store needs no Master, hence no operator init container."""
    return spec.nnodes.max > 1


def store_name(spec: JobSpec) -> str:
    """The Deployment's and the Service's name (the rendezvous host): ``<job>-rdzv``."""
    if len(spec.name) + len(SUFFIX) > DNS_LABEL_MAX:
        raise bad("name", spec.name, f"is {len(spec.name)} characters: the rendezvous "
                  f"Service of a Kubernetes job of several pods is <name>{SUFFIX}, and a "
                  f"Service name has at most {DNS_LABEL_MAX}; use at most "
                  f"{DNS_LABEL_MAX - len(SUFFIX)} characters")
    return spec.name + SUFFIX


def store_labels(spec: JobSpec) -> Obj:
    """Labels of both objects and the store's pod, tying them to the job; also the selector."""
    return {"app.kubernetes.io/name": spec.name, COMPONENT_LABEL: COMPONENT,
            "app.kubernetes.io/managed-by": "torchjob"}


def _meta(spec: JobSpec) -> Obj:
    return {"name": store_name(spec), "namespace": spec.k8s.namespace,
            "labels": store_labels(spec)}


def render_deployment(spec: JobSpec) -> Obj:
    port = spec.rdzv.port
    container: Obj = {
        "name": CONTAINER, "image": spec.image,
        "command": command_words(list(store_command(spec, python="python", port=port))),
        "ports": [{"name": "c10d", "containerPort": port}],
        # published by the Service only once it serves: agents never dial an empty port
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": {"limits": dict(LIMITS), "requests": dict(REQUESTS)},
        "securityContext": container_security(spec)}
    pod: Obj = {"securityContext": pod_security(spec)}
    if spec.k8s.service_account:
        pod["serviceAccountName"] = spec.k8s.service_account
    else:
        pod["automountServiceAccountToken"] = False
    if spec.k8s.priority_class:
        pod["priorityClassName"] = spec.k8s.priority_class
    pod["containers"] = [container]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(spec),
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": store_labels(spec)},
                     "template": {"metadata": {"labels": store_labels(spec)}, "spec": pod}}}


def render_service(spec: JobSpec) -> Obj:
    port = spec.rdzv.port
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec),
            "spec": {"type": "ClusterIP", "selector": store_labels(spec),
                     "ports": [{"name": "c10d", "port": port, "targetPort": port,
                                "protocol": "TCP"}]}}


def render_store(spec: JobSpec) -> list[Obj]:
    """[Deployment, Service] of a job of several pods' store; [] for a one-pod job.

    The store (``python -m torchjob.trainer.store``, the job's image) runs in a pod of its own,
    which its Deployment (``Recreate``: never two stores) recreates when lost; the agents, which
    cannot reconnect, exit ``EXIT_STORE_LOST`` to be retried. The Service is
    ``elasticPolicy.rdzvHost``; every agent is its client (docs/internals.md)."""
    return [render_deployment(spec), render_service(spec)] if has_store(spec) else []

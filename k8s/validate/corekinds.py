"""The API server's own validation of the rendezvous store's Deployment (``apps/v1``) and
Service (``v1``): the fields it requires, not a full schema (none of the core kinds is kept)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from torchjob.jobs.values import subdomain_problem
from torchjob.k8s.validate.meta import dns_1035_problem
from torchjob.k8s.validate.tree import get_in

# k8s.io/kubernetes pkg/apis/apps/validation and pkg/apis/core/validation; the pod template's
# Pod Security is podsecurity's.
Rule = tuple[str, str, str]  # (rule, field path, message)
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")


def _spec(obj: dict[str, Any]) -> Generator[Rule, None, dict[str, Any] | None]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        yield ("schema", "spec", "is required and must be a mapping")
        return None
    return spec


def deployment(obj: dict[str, Any]) -> Iterator[Rule]:
    """The fields ``apps/v1`` Deployment validation requires, and the pod template's."""
    name = get_in(obj, "metadata", "name")
    why = subdomain_problem(name) if isinstance(name, str) else "is required"
    if why:
        yield ("name", "metadata.name", f"{name!r} {why}")
    spec = yield from _spec(obj)
    if spec is None:
        return
    count = spec.get("replicas", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        yield ("schema", "spec.replicas", f"is {count!r}: an integer >= 0")
    strategy = get_in(spec, "strategy", "type")
    if strategy is not None and strategy not in ("Recreate", "RollingUpdate"):
        yield ("enum", "spec.strategy.type", f"{strategy!r} is not one of Recreate, "
               "RollingUpdate")
    selector = get_in(spec, "selector", "matchLabels")
    labels = get_in(spec, "template", "metadata", "labels")
    if not isinstance(selector, dict) or not selector:
        yield ("selector", "spec.selector.matchLabels", "is required (the labels of the pods "
               "the Deployment owns)")
    elif not isinstance(labels, dict) or any(labels.get(k) != v for k, v in selector.items()):
        yield ("selector", "spec.template.metadata.labels", "must include every label of "
               "spec.selector.matchLabels")
    pod = get_in(spec, "template", "spec")
    where = "spec.template.spec"
    if not isinstance(pod, dict):
        yield ("schema", where, "is required and must be a mapping")
        return
    policy = pod.get("restartPolicy", "Always")
    if policy != "Always":
        yield ("restart-policy", f"{where}.restartPolicy", f"is {policy!r}: a Deployment's "
               "pods must use Always")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        yield ("schema", f"{where}.containers", "needs at least one container")
        containers = []
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
            yield ("image", f"{where}.containers[{i}]", "every container needs a name and an "
                   "image")
        else:
            yield from ports(f"{where}.containers[{i}].ports", c.get("ports"), "containerPort")


def ports(where: str, items: object, key: str) -> Iterator[Rule]:
    for j, port in enumerate(items if isinstance(items, list) else []):
        value = port.get(key) if isinstance(port, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            yield ("port", f"{where}[{j}].{key}", f"is {value!r}: a port number 1-65535")


def service(obj: dict[str, Any]) -> Iterator[Rule]:
    """The fields ``v1`` Service validation requires."""
    name = get_in(obj, "metadata", "name")
    why = dns_1035_problem(name)
    if why:
        yield ("name", "metadata.name", why)
    spec = yield from _spec(obj)
    if spec is None:
        return
    kind = spec.get("type", "ClusterIP")
    if kind not in SERVICE_TYPES:
        yield ("enum", "spec.type", f"{kind!r} is not one of {', '.join(SERVICE_TYPES)}")
    selector = spec.get("selector")
    if selector is not None and (not isinstance(selector, dict) or not all(
            isinstance(v, str) for v in selector.values())):
        yield ("selector", "spec.selector", "must map label names to strings")
    items = spec.get("ports")
    if kind != "ExternalName" and (not isinstance(items, list) or not items):
        yield ("port", "spec.ports", "needs at least one port")
    yield from ports("spec.ports", items, "port")
    for j, port in enumerate(items if isinstance(items, list) else []):
        proto = port.get("protocol", "TCP") if isinstance(port, dict) else None
        if proto not in ("TCP", "UDP", "SCTP"):
            yield ("enum", f"spec.ports[{j}].protocol", f"{proto!r} is not one of TCP, UDP, "
                   "SCTP")


CORE_KINDS = {("apps/v1", "Deployment"): deployment, ("v1", "Service"): service}

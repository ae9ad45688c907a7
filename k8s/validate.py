"""Validate a PyTorchJob or TrainJob manifest, rendered or hand-written. Reads no cluster.

Four layers, each problem naming its rule and field path: the upstream CRD schema
(``k8s.schema``), the operator's admission rules (K8S-CONTRACT.md), Pod Security
"restricted", and no literal secret values in ``env``. The Deployment (``apps/v1``) and
Service (``v1``) of an elastic job's rendezvous store (``k8s.store``) get structural checks of
the fields the API server requires (no OpenAPI schema of the core kinds is kept here) and, for
the Deployment's pod template, Pod Security "restricted".
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from jobs.values import DNS_1035, DNS_1123_SUBDOMAIN
from k8s.schema import structural_problems

REPLICA_TYPES = ("Master", "Worker")
NPROC = re.compile(r"auto|cpu|gpu|[1-9][0-9]*")
# Restricted allows only these volume types (and no hostPath, which baseline already forbids).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SECRET_WORDS = {"PASSWORD", "PASSWD", "TOKEN", "SECRET", "KEY", "APIKEY", "CREDENTIAL",
                "CREDENTIALS", "PRIVATE"}
SECRET_VALUE = re.compile(r"(ghp_|gho_|github_pat_|hf_|sk-|xox[abp]-|AKIA|glpat-)"
                          r"[A-Za-z0-9_\-]{8,}|-----BEGIN [A-Z ]*PRIVATE KEY-----")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
ENUMS = {"spec.runPolicy.cleanPodPolicy": ("All", "Running", "None"),
         "spec.elasticPolicy.rdzvBackend": ("c10d", "etcd", "etcd-v2"),
         "spec.runPolicy.managedBy": ("kubeflow.org/training-operator",
                                      "kueue.x-k8s.io/multikueue")}
# The five variables the TrainJob torch plugin injects and users may not set.
TRAINJOB_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                     "PET_MASTER_PORT"}


@dataclass(frozen=True)
class Problem:
    """One broken rule: ``rule`` (e.g. ``master-replicas``), the field ``path``, a message."""

    rule: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<manifest>'}: {self.message} [{self.rule}]"


def validate(obj: object, *, pod_security: bool = True) -> list[Problem]:
    """Every problem of one manifest (a dict as parsed from YAML); [] when it is valid.
    ``pod_security=False`` skips the "restricted" checks (for namespaces that do not enforce
    it)."""
    if not isinstance(obj, dict):
        return [Problem("manifest", "", f"is {type(obj).__name__}, not a mapping")]
    core = CORE_KINDS.get((str(obj.get("apiVersion")), str(obj.get("kind"))))
    if core is not None:
        return [*core(obj, pod_security), *_secret_literals(obj)]
    problems = [Problem("schema", path, message) for path, message in structural_problems(obj)]
    if any(p.path == "kind" for p in problems):
        return problems
    problems += _name(obj)
    if obj.get("kind") == "PyTorchJob":
        problems += _pytorchjob(obj)
        problems += _restricted_pods(obj) if pod_security else []
    else:
        problems += _trainjob(obj)
    problems += _secret_literals(obj)
    return problems


def _name_and_spec(obj: dict[str, Any], pattern: re.Pattern[str], limit: int, what: str
                   ) -> Generator[Problem, None, dict[str, Any] | None]:
    """Problems of ``metadata.name`` (``what``, at most ``limit`` characters) and of a missing
    ``spec``; returns the spec (None when there is none)."""
    name = _get(obj, "metadata", "name")
    if not isinstance(name, str) or len(name) > limit or not pattern.fullmatch(name):
        yield Problem("name", "metadata.name", f"{name!r} is not {what}, at most {limit} "
                      "characters)")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        yield Problem("schema", "spec", "is required and must be a mapping")
        return None
    return spec


def _deployment(obj: dict[str, Any], pod_security: bool) -> Iterator[Problem]:
    """The fields ``apps/v1`` Deployment validation requires, and the pod template."""
    spec = yield from _name_and_spec(obj, DNS_1123_SUBDOMAIN, 253, "a DNS-1123 subdomain (lower "
                                     "case letters, digits, '-' and '.'")
    if spec is None:
        return
    count = spec.get("replicas", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        yield Problem("schema", "spec.replicas", f"is {count!r}: an integer >= 0")
    strategy = _get(spec, "strategy", "type")
    if strategy is not None and strategy not in ("Recreate", "RollingUpdate"):
        yield Problem("enum", "spec.strategy.type", f"{strategy!r} is not one of Recreate, "
                      "RollingUpdate")
    selector = _get(spec, "selector", "matchLabels")
    labels = _get(spec, "template", "metadata", "labels")
    if not isinstance(selector, dict) or not selector:
        yield Problem("selector", "spec.selector.matchLabels", "is required (the labels of "
                      "the pods the Deployment owns)")
    elif not isinstance(labels, dict) or any(labels.get(k) != v for k, v in selector.items()):
        yield Problem("selector", "spec.template.metadata.labels", "must include every label "
                      "of spec.selector.matchLabels")
    pod = _get(spec, "template", "spec")
    where = "spec.template.spec"
    if not isinstance(pod, dict):
        yield Problem("schema", where, "is required and must be a mapping")
        return
    policy = pod.get("restartPolicy", "Always")
    if policy != "Always":
        yield Problem("restart-policy", f"{where}.restartPolicy", f"is {policy!r}: a "
                      "Deployment's pods must use Always")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        yield Problem("schema", f"{where}.containers", "needs at least one container")
        containers = []
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
            yield Problem("image", f"{where}.containers[{i}]", "every container needs a name "
                          "and an image")
        else:
            yield from _ports(f"{where}.containers[{i}].ports", c.get("ports"), "containerPort")
    if pod_security:
        yield from _restricted(where, pod)


def _ports(where: str, ports: object, key: str) -> Iterator[Problem]:
    for j, port in enumerate(ports if isinstance(ports, list) else []):
        value = port.get(key) if isinstance(port, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            yield Problem("port", f"{where}[{j}].{key}", f"is {value!r}: a port number "
                          "1-65535")


def _service(obj: dict[str, Any], pod_security: bool) -> Iterator[Problem]:
    """The fields ``v1`` Service validation requires."""
    spec = yield from _name_and_spec(obj, DNS_1035, 63, "a DNS-1035 label (lower case letters, "
                                     "digits and '-', starting with a letter")
    if spec is None:
        return
    kind = spec.get("type", "ClusterIP")
    if kind not in SERVICE_TYPES:
        yield Problem("enum", "spec.type", f"{kind!r} is not one of {', '.join(SERVICE_TYPES)}")
    selector = spec.get("selector")
    if selector is not None and (not isinstance(selector, dict) or not all(
            isinstance(v, str) for v in selector.values())):
        yield Problem("selector", "spec.selector", "must map label names to strings")
    ports = spec.get("ports")
    if kind != "ExternalName" and (not isinstance(ports, list) or not ports):
        yield Problem("port", "spec.ports", "needs at least one port")
    yield from _ports("spec.ports", ports, "port")
    for j, port in enumerate(ports if isinstance(ports, list) else []):
        proto = port.get("protocol", "TCP") if isinstance(port, dict) else None
        if proto not in ("TCP", "UDP", "SCTP"):
            yield Problem("enum", f"spec.ports[{j}].protocol", f"{proto!r} is not one of TCP, "
                          "UDP, SCTP")


SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
CORE_KINDS = {("apps/v1", "Deployment"): _deployment, ("v1", "Service"): _service}


def validate_text(text: str, *, pod_security: bool = True) -> list[Problem]:
    """Problems of every YAML document in ``text``; paths get ``[i]`` when there are several."""
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        return [Problem("yaml", "", " ".join(str(exc).split()))]
    if len(docs) == 1:
        return validate(docs[0], pod_security=pod_security)
    if not docs:
        return [Problem("manifest", "", "the text holds no YAML document")]
    return [Problem(p.rule, f"[{i}].{p.path}" if p.path else f"[{i}]", p.message)
            for i, doc in enumerate(docs) for p in validate(doc, pod_security=pod_security)]


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _name(obj: dict[str, Any]) -> Iterator[Problem]:
    name = _get(obj, "metadata", "name")
    if not isinstance(name, str) or len(name) > 63 or not DNS_1035.fullmatch(name):
        yield Problem("name", "metadata.name", f"{name!r} is not a DNS-1035 label (lower case "
                      "letters, digits and '-', starting with a letter, at most 63 characters)")


def _pytorchjob(obj: dict[str, Any]) -> Iterator[Problem]:
    spec = _dict(obj.get("spec"))
    replicas = spec.get("pytorchReplicaSpecs")
    if not isinstance(replicas, dict):
        return
    base = "spec.pytorchReplicaSpecs"
    for key in replicas:
        if key not in REPLICA_TYPES:
            fix = f" (write {str(key).capitalize()!r})" \
                if str(key).capitalize() in REPLICA_TYPES else ""
            yield Problem("replica-type", f"{base}.{key}", f"{key!r} is not a replica type: "
                          f"only {' and '.join(REPLICA_TYPES)}, capitalised{fix}")
    for key in REPLICA_TYPES:
        if not isinstance(replicas.get(key), dict):
            continue
        rs = replicas[key]
        containers = _get(rs, "template", "spec", "containers") or []
        where = f"{base}.{key}.template.spec.containers"
        if not any(isinstance(c, dict) and c.get("name") == "pytorch" for c in containers):
            yield Problem("pytorch-container", where, f"{key} has no container named 'pytorch'")
        for i, c in enumerate(containers):
            if isinstance(c, dict) and not c.get("image"):
                yield Problem("image", f"{where}[{i}].image", "every container needs an image")
        policy = rs.get("restartPolicy")
        if policy is not None and policy not in RESTART_POLICIES:
            yield Problem("restart-policy", f"{base}.{key}.restartPolicy", f"{policy!r} is not "
                          f"one of {', '.join(RESTART_POLICIES)}")
        count = rs.get("replicas")
        if key == "Master" and count != 1:
            state = "is missing" if count is None else f"is {count!r}"
            yield Problem("master-replicas", f"{base}.Master.replicas",
                          f"{state}: Master must set replicas: 1")
        if key == "Worker" and count is not None and (not isinstance(count, int) or count < 1):
            yield Problem("worker-replicas", f"{base}.Worker.replicas",
                          f"is {count!r}: Worker replicas must be >= 1 (or leave Worker out)")
    elastic = spec.get("elasticPolicy")
    if isinstance(elastic, dict):
        if "Worker" not in replicas:
            yield Problem("elastic-worker", "spec.elasticPolicy", "an elasticPolicy needs a "
                          "Worker replica spec")
        if "nProcPerNode" in elastic and "nprocPerNode" in spec:
            yield Problem("nproc-conflict", "spec.elasticPolicy.nProcPerNode", "is deprecated "
                          "and may not be combined with spec.nprocPerNode: keep only the latter")
        if elastic.get("standalone"):
            yield Problem("elastic-standalone", "spec.elasticPolicy.standalone", "true makes "
                          "the operator set PET_STANDALONE='', which torchrun cannot parse")
    yield from _values(spec)
    nproc = spec.get("nprocPerNode")
    if isinstance(nproc, str) and not NPROC.fullmatch(nproc):
        yield Problem("nproc-per-node", "spec.nprocPerNode", f"{nproc!r} is not auto, cpu, gpu "
                      "or a positive integer as a string")


def _values(spec: dict[str, Any]) -> Iterator[Problem]:
    """Enumerations the operator's Go types define but the CRD does not state."""
    for path, allowed in ENUMS.items():
        value = _get(spec, *path.split(".")[1:])
        if value is not None and value not in allowed:
            yield Problem("enum", path, f"{value!r} is not one of {', '.join(allowed)}")


def _trainjob(obj: dict[str, Any]) -> Iterator[Problem]:
    trainer = _get(obj, "spec", "trainer")
    if not isinstance(trainer, dict):
        return
    for i, item in enumerate(trainer.get("env") or []):
        if isinstance(item, dict) and item.get("name") in TRAINJOB_RESERVED:
            yield Problem("reserved-env", f"spec.trainer.env[{i}].name", f"{item['name']} is "
                          "set by the TrainJob torch plugin; remove it")


def _pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    replicas = _get(obj, "spec", "pytorchReplicaSpecs")
    for key, rs in (replicas.items() if isinstance(replicas, dict) else []):
        pod = _get(rs, "template", "spec")
        if isinstance(pod, dict):
            yield f"spec.pytorchReplicaSpecs.{key}.template.spec", pod


def _restricted_pods(obj: dict[str, Any]) -> Iterator[Problem]:
    for where, pod in _pod_templates(obj):
        yield from _restricted(where, pod)


def _restricted(where: str, pod: dict[str, Any]) -> Iterator[Problem]:
    """Pod Security Standard "restricted" (v1.25+ rules) for one pod template."""
    rule = "pod-security"
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            yield Problem(rule, f"{where}.{flag}", "must not be true")
    psc = _dict(pod.get("securityContext"))
    if psc.get("runAsUser") == 0:
        yield Problem(rule, f"{where}.securityContext.runAsUser", "must not be 0 (root)")
    seccomp_types = ("RuntimeDefault", "Localhost")
    pod_seccomp = _get(psc, "seccompProfile", "type")
    if pod_seccomp is not None and pod_seccomp not in seccomp_types:
        yield Problem(rule, f"{where}.securityContext.seccompProfile.type",
                      f"is {pod_seccomp!r}: must be RuntimeDefault or Localhost")
    for i, vol in enumerate(pod.get("volumes") or []):
        kinds = set(vol) - {"name"} if isinstance(vol, dict) else set()
        if kinds - RESTRICTED_VOLUMES:
            yield Problem(rule, f"{where}.volumes[{i}]", f"{sorted(kinds)[0]} volumes are not "
                          f"allowed (allowed: {', '.join(sorted(RESTRICTED_VOLUMES))})")
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(pod.get(group) or []):
            if isinstance(c, dict):
                yield from _restricted_container(f"{where}.{group}[{i}]", c, psc)


def _restricted_container(where: str, c: dict[str, Any], psc: dict[str, Any],
                          ) -> Iterator[Problem]:
    rule = "pod-security"
    sc = _dict(c.get("securityContext"))
    path = f"{where}.securityContext"
    if sc.get("privileged"):
        yield Problem(rule, f"{path}.privileged", "must not be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        yield Problem(rule, f"{path}.allowPrivilegeEscalation", "must be set to false")
    caps = _dict(sc.get("capabilities"))
    if "ALL" not in (caps.get("drop") or []):
        yield Problem(rule, f"{path}.capabilities.drop", "must include ALL")
    added = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
    if added:
        yield Problem(rule, f"{path}.capabilities.add", f"may add only NET_BIND_SERVICE, "
                      f"not {sorted(added)}")
    non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
    if non_root is not True:
        yield Problem(rule, f"{path}.runAsNonRoot", "must be true (here or in the pod's "
                      "securityContext)")
    if sc.get("runAsUser") == 0:
        yield Problem(rule, f"{path}.runAsUser", "must not be 0 (root)")
    seccomp = _get(sc, "seccompProfile", "type") or _get(psc, "seccompProfile", "type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        yield Problem(rule, f"{path}.seccompProfile.type", f"is {seccomp!r}: set "
                      "RuntimeDefault (here or in the pod's securityContext)")
    for j, port in enumerate(c.get("ports") or []):
        if isinstance(port, dict) and port.get("hostPort"):
            yield Problem(rule, f"{where}.ports[{j}].hostPort", "host ports are not allowed")


def _env_lists(obj: Any, path: str) -> Iterator[tuple[str, list[Any]]]:
    """Every ``env`` list anywhere in the manifest, with its path."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            sub = f"{path}.{key}" if path else str(key)
            if key == "env" and isinstance(value, list):
                yield sub, value
            else:
                yield from _env_lists(value, sub)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _env_lists(value, f"{path}[{i}]")


def looks_secret(name: str, value: str) -> bool:
    """A literal env value that is (probably) a secret: a secret-like name, or a token shape."""
    words = set(re.split(r"[^A-Z0-9]+", name.upper()))
    return bool(value) and (bool(words & SECRET_WORDS) or bool(SECRET_VALUE.search(value)))


def _secret_literals(obj: dict[str, Any]) -> Iterator[Problem]:
    for path, items in _env_lists(obj, ""):
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("value"), str):
                continue
            name = str(item.get("name", ""))
            if looks_secret(name, item["value"]):
                yield Problem("secret-literal", f"{path}[{i}].value", f"{name} holds a literal "
                              "value that looks like a secret: put it in a Secret and use "
                              "valueFrom.secretKeyRef (in a job spec: secrets: [{env, secret, "
                              "key}])")

"""The Kubernetes manifest validator: every broken rule of a PyTorchJob, TrainJob, training
runtime, or a rendezvous store's Deployment or Service, with its field path. Reads no cluster."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from torchjob.k8s.validate import podsecurity, runtimes as known_runtimes, webhooks
from torchjob.k8s.validate.corekinds import CORE_KINDS
from torchjob.k8s.validate.meta import object_meta_problems, template_meta_problems
from torchjob.k8s.validate.schema import CRDS, is_namespaced, structural_problems
from torchjob.k8s.validate.tree import get_in
from torchjob.k8s.yaml import YamlProblem, load_all

# A problem's layer. "api": what the API server refuses on create (the CRD's schema and CEL
# rules, metadata, the operators' webhooks, and pod template labels, which Pod validation refuses
# when the operator makes the pods); tests/k8s/corpus holds it to upstream's own verdicts.
# "restricted": Pod Security "restricted", a namespace's policy, so a report rather than a
# verdict. "lint": torchjob's advice on settings the API accepts that fail at run time or leak.
LAYERS = ("api", "restricted", "lint")
NPROC = re.compile(r"auto|cpu|gpu|[1-9][0-9]*")
SECRET_WORDS = {"PASSWORD", "PASSWD", "TOKEN", "SECRET", "KEY", "APIKEY", "CREDENTIAL",
                "CREDENTIALS", "PRIVATE"}
SECRET_VALUE = re.compile(r"(ghp_|gho_|github_pat_|hf_|sk-|xox[abp]-|AKIA|glpat-)"
                          r"[A-Za-z0-9_\-]{8,}|-----BEGIN [A-Z ]*PRIVATE KEY-----")


@dataclass(frozen=True)
class Problem:
    """One broken rule: ``rule`` (e.g. ``master-replicas``), the field ``path``, a message, and
    its ``layer`` (api, restricted or lint)."""

    rule: str
    path: str
    message: str
    layer: str = "api"

    def __str__(self) -> str:
        head = "" if self.layer == "api" else f"{self.layer}: "
        return f"{head}{self.path or '<manifest>'}: {self.message} [{self.rule}]"


Runtimes = known_runtimes.Runtimes


def validate(obj: object, *, pod_security: bool = True, runtimes: Runtimes | None = None,
             runtime_pods: bool = False) -> list[Problem]:
    """Every problem of one manifest (a dict as parsed from YAML); [] when it is valid.
    ``pod_security=False`` leaves out the "restricted" report; ``runtimes``: the training
    runtimes a TrainJob may use (default: those upstream installs; validate_text adds those
    of its text); ``runtime_pods``: Pod Security of a TrainJob's pods as its known runtime makes
    them (off by default until torchjob's TrainJob carries the securityContext patches; the
    stock torch-distributed runtime sets none, so "restricted" refuses its pods)."""
    if runtimes is None:
        runtimes = known_runtimes.default_runtimes()
    if not isinstance(obj, dict):
        return [Problem("manifest", "", f"is {type(obj).__name__}, not a mapping")]
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    problems: list[Problem] = []
    if key in CORE_KINDS:
        problems += [Problem(*rule) for rule in CORE_KINDS[key](obj)]
        problems += [Problem("metadata", path, message) for path, message
                     in object_meta_problems(obj.get("metadata"), names=False)]
    else:
        found = structural_problems(obj)
        problems += [Problem("cel" if "(CEL: " in message else "schema", path, message)
                     for path, message in found]
        if any(p.path == "kind" for p in problems):
            return problems
        problems += [Problem("metadata", path, message) for path, message
                     in object_meta_problems(obj.get("metadata"), is_namespaced(*key))]
        problems += [Problem(*rule) for rule in _webhook(obj, key[1], runtimes)]
    problems += [Problem("pod-template-labels", path, message)
                 for path, message in _template_meta(obj)]
    if pod_security:
        problems += [Problem("pod-security", path, message, "restricted")
                     for path, message in _restricted(obj, runtimes if runtime_pods else {})]
    problems += _lint(obj)
    return problems


def _webhook(obj: dict[str, Any], kind: str, runtimes: Runtimes) -> Iterable[tuple[str, ...]]:
    if kind == "PyTorchJob":
        return webhooks.pytorchjob(obj)
    if kind == "TrainJob":
        return webhooks.trainjob(obj, runtimes)
    return webhooks.runtime(obj)


def _items(value: object) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        yield from ((str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        yield from ((f"[{i}]", v) for i, v in enumerate(value))


def pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Every pod template of a manifest: (path of the template, template, complete), where a
    TrainJob's runtimePatches are patches (not complete pod specs)."""
    kind = obj.get("kind")
    if kind == "PyTorchJob":
        for key, rs in _items(get_in(obj, "spec", "pytorchReplicaSpecs")):
            yield f"spec.pytorchReplicaSpecs.{key}.template", get_in(rs, "template"), True
    elif kind == "Deployment":
        yield "spec.template", get_in(obj, "spec", "template"), True
    elif kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        jobs = get_in(obj, "spec", "template", "spec", "replicatedJobs")
        for i, rjob in _items(jobs if isinstance(jobs, list) else None):
            yield (f"spec.template.spec.replicatedJobs{i}.template.spec.template",
                   get_in(rjob, "template", "spec", "template"), True)
    elif kind == "TrainJob":
        for i, patch in _items(get_in(obj, "spec", "runtimePatches")):
            base = f"spec.runtimePatches{i}.trainingRuntimeSpec.template.spec.replicatedJobs"
            jobs = get_in(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs")
            for j, rjob in _items(jobs if isinstance(jobs, list) else None):
                yield (f"{base}{j}.template.spec.template",
                       get_in(rjob, "template", "spec", "template"), False)


def _template_meta(obj: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for where, template, _ in pod_templates(obj):
        yield from template_meta_problems(get_in(template, "metadata"), f"{where}.metadata")
    if obj.get("kind") in ("TrainingRuntime", "ClusterTrainingRuntime"):
        for i, rjob in _items(get_in(obj, "spec", "template", "spec", "replicatedJobs")):
            where = f"spec.template.spec.replicatedJobs{i}.template.metadata"
            yield from template_meta_problems(get_in(rjob, "template", "metadata"), where)


def _restricted(obj: dict[str, Any], runtimes: Runtimes) -> Iterator[tuple[str, str]]:
    """Pod Security of every pod: a TrainJob's are its known runtime's with its patches."""
    if obj.get("kind") == "TrainJob":
        kind, runtime = known_runtimes.referenced(obj, runtimes)
        if runtime is not None:
            name = get_in(runtime, "metadata", "name")
            for job, template in known_runtimes.trainjob_pods(obj, runtime):
                where = (f"spec.runtimeRef({kind} {name}: replicatedJobs[{job}] with "
                         "spec.runtimePatches).template.spec")
                pod = get_in(template, "spec")
                yield from podsecurity.restricted(pod if isinstance(pod, dict) else {}, where,
                                                  get_in(template, "metadata", "annotations"))
            return
    for where, template, complete in pod_templates(obj):
        pod = get_in(template, "spec")
        if isinstance(pod, dict):
            yield from podsecurity.restricted(pod, f"{where}.spec",
                                              get_in(template, "metadata", "annotations"),
                                              complete)


def validate_text(text: str, *, pod_security: bool = True,
                  runtime_pods: bool = False) -> list[Problem]:
    """Problems of every YAML document in ``text``; paths get ``[i]`` when there are several.
    The training runtimes among the documents serve the TrainJobs among them."""
    try:
        docs = load_all(text)
    except (yaml.YAMLError, YamlProblem) as exc:
        return [Problem("yaml", "", " ".join(str(exc).split()))]
    if not docs:
        return [Problem("manifest", "", "the text holds no YAML document")]
    runtimes = known_runtimes.default_runtimes()
    runtimes.update({known_runtimes.runtime_key(d): d for d in docs if isinstance(d, dict)
                     and (str(d.get("apiVersion")), str(d.get("kind"))) in CRDS
                     and str(d.get("kind")) in webhooks.RUNTIME_KINDS})
    if len(docs) == 1:
        return validate(docs[0], pod_security=pod_security, runtimes=runtimes,
                        runtime_pods=runtime_pods)
    return [Problem(p.rule, f"[{i}].{p.path}" if p.path else f"[{i}]", p.message, p.layer)
            for i, doc in enumerate(docs)
            for p in validate(doc, pod_security=pod_security, runtimes=runtimes,
                              runtime_pods=runtime_pods)]


def _lint(obj: dict[str, Any]) -> list[Problem]:
    problems = list(_secret_literals(obj))
    if obj.get("kind") == "PyTorchJob":
        if get_in(obj, "spec", "elasticPolicy", "standalone") is True:
            problems.append(Problem("elastic-standalone", "spec.elasticPolicy.standalone",
                                    "true makes the operator set PET_STANDALONE='', which "
                                    "torchrun cannot parse: leave it out", "lint"))
        nproc = get_in(obj, "spec", "nprocPerNode")
        if isinstance(nproc, str) and not NPROC.fullmatch(nproc):
            problems.append(Problem("nproc-per-node", "spec.nprocPerNode", f"{nproc!r} is not "
                                    "auto, cpu, gpu or a positive integer as a string: "
                                    "torchrun cannot read it", "lint"))
    return problems


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
                              "key}])", "lint")

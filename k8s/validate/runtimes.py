"""The training runtimes a TrainJob may refer to, known without a cluster, and the pods a
TrainJob gets from its runtime with its ``runtimePatches`` merged in."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import yaml

from torchjob.k8s.validate.schema import SCHEMA_DIR
from torchjob.k8s.validate.tree import as_list, get_in

Runtimes = dict[tuple[str, str, str], dict[str, Any]]  # (kind, namespace or "", name) -> obj
MERGE_BY_NAME = ("containers", "initContainers", "volumes", "env", "volumeMounts")


def runtime_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    kind = str(obj.get("kind"))
    namespace = str(get_in(obj, "metadata", "namespace") or "default")
    name = str(get_in(obj, "metadata", "name"))
    return kind, namespace if kind == "TrainingRuntime" else "", name


@functools.lru_cache(maxsize=1)
def _defaults() -> tuple[tuple[tuple[str, str, str], dict[str, Any]], ...]:
    found = []
    for path in sorted(SCHEMA_DIR.glob("runtime_*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                found.append((runtime_key(doc), doc))
    return tuple(found)


def default_runtimes() -> Runtimes:
    """The ClusterTrainingRuntimes upstream installs (v2.3.0 ``manifests/base/runtimes``,
    vendored byte for byte in k8s/schemas as ``runtime_*.yaml``; a cluster whose admin changed
    one may differ), by key: a new dict of shared objects, which nothing here changes."""
    return dict(_defaults())


def referenced(obj: dict[str, Any], runtimes: Runtimes) -> tuple[str, dict[str, Any] | None]:
    """The kind of a TrainJob's runtime (the CRD's default: ClusterTrainingRuntime) and the
    runtime object when it is known."""
    ref = get_in(obj, "spec", "runtimeRef")
    kind = str(get_in(ref, "kind") or "ClusterTrainingRuntime")
    namespace = str(get_in(obj, "metadata", "namespace") or "default")
    key = (kind, namespace if kind == "TrainingRuntime" else "", str(get_in(ref, "name")))
    return kind, runtimes.get(key)


def merge(base: Any, patch: Any) -> Any:
    """``patch`` applied to ``base`` as the controller's strategic merge applies it to these
    fields: maps recursively, the lists of MERGE_BY_NAME by ``name``, anything else replaced;
    neither is changed."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if key in MERGE_BY_NAME and isinstance(value, list):
                out[key] = _merge_named(as_list(base.get(key)), value)
            else:
                out[key] = merge(base.get(key), value)
        return out
    return copy.deepcopy(patch)


def _merge_named(base: list[Any], patch: list[Any]) -> list[Any]:
    out = [copy.deepcopy(item) for item in base]
    names = [get_in(item, "name") for item in out]
    for item in patch:
        name = get_in(item, "name")
        if name is not None and name in names:
            out[names.index(name)] = merge(out[names.index(name)], item)
        else:
            out.append(copy.deepcopy(item))
    return out


def trainjob_pods(obj: dict[str, Any], runtime: dict[str, Any],
                  ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(replicated job name, pod template) of each job of ``runtime`` with ``obj``'s
    runtimePatches applied, in patch order."""
    for rjob in as_list(get_in(runtime, "spec", "template", "spec", "replicatedJobs")):
        name = get_in(rjob, "name")
        template = get_in(rjob, "template", "spec", "template")
        template = template if isinstance(template, dict) else {}
        for patch in as_list(get_in(obj, "spec", "runtimePatches")):
            for pjob in as_list(get_in(patch, "trainingRuntimeSpec", "template", "spec",
                                   "replicatedJobs")):
                if get_in(pjob, "name") == name:
                    template = merge(template, get_in(pjob, "template", "spec", "template") or {})
        yield str(name), template

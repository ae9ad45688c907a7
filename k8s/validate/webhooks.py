"""The operators' validating admission webhooks, offline, for PyTorchJob, TrainJob and the
training runtimes: each rule is upstream's, cited where it is defined."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from torchjob.jobs.values import subdomain_problem
from torchjob.k8s.validate.meta import dns_1035_problem, effective_name
from torchjob.k8s.validate.runtimes import Runtimes, referenced
from torchjob.k8s.validate.tree import as_list, get_in

Rule = tuple[str, str, str]  # (rule, field path, message)
GROUP = "trainer.kubeflow.org"
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
REPLICA_TYPES = ("Master", "Worker")
MANAGED_BY = ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")
# constants.TorchRunReservedEnvNames
TORCH_RESERVED = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                  "PET_MASTER_PORT")
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_CONTAINER = {"trainer": "node", "model-initializer": "model-initializer",
                      "dataset-initializer": "dataset-initializer"}
INITIALIZER_VOLUME = "initializer"
FLUX_INSTALLER = "flux-installer"
HTTP_PATH = re.compile(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+")


def pytorchjob(obj: dict[str, Any]) -> Iterator[Rule]:
    """The PyTorchJob webhook (kubeflow/trainer release-1.9, pkg/webhooks/pytorch and
    pkg/common/util/webhooks.go). Nothing else: the CRD has no enum for ``rdzvBackend``,
    ``restartPolicy`` or ``cleanPodPolicy``, and no webhook checks them."""
    name = effective_name(obj.get("metadata"))
    why = dns_1035_problem(name) if name is not None else None
    if why:
        yield ("name", "metadata.name", why)
    spec: dict[str, Any] = obj["spec"] if isinstance(obj.get("spec"), dict) else {}
    managed = get_in(spec, "runPolicy", "managedBy")
    if managed is not None and managed not in MANAGED_BY:
        yield ("managed-by", "spec.runPolicy.managedBy", f"{managed!r} is not one of "
               f"{', '.join(MANAGED_BY)}")
    replicas = spec.get("pytorchReplicaSpecs")
    base = "spec.pytorchReplicaSpecs"
    if not isinstance(replicas, dict):
        return  # the CRD requires it; the schema layer says so
    if isinstance(spec.get("elasticPolicy"), dict):
        if "Worker" not in replicas:
            yield ("elastic-worker", f"{base}.Worker", "must be configured if an elasticPolicy "
                   "is used")
        if spec["elasticPolicy"].get("nProcPerNode") is not None \
                and spec.get("nprocPerNode") is not None:
            yield ("nproc-conflict", "spec.elasticPolicy.nProcPerNode", "is deprecated and "
                   "may not be combined with spec.nprocPerNode: keep only the latter")
    for key, rs in replicas.items():
        where = f"{base}.{key}"
        if key not in REPLICA_TYPES:
            fix = f" (write {str(key).capitalize()!r})" \
                if str(key).capitalize() in REPLICA_TYPES else ""
            yield ("replica-type", where, f"{key!r} is not a replica type: only "
                   f"{' and '.join(REPLICA_TYPES)}, capitalised{fix}")
        containers = as_list(get_in(rs, "template", "spec", "containers"))
        cpath = f"{where}.template.spec.containers"
        if not containers:
            yield ("containers", cpath, "must be specified")
        for i, c in enumerate(containers):
            if isinstance(c, dict) and not c.get("image"):
                yield ("image", f"{cpath}[{i}].image", "every container needs an image")
        if not any(isinstance(c, dict) and c.get("name") == "pytorch" for c in containers):
            yield ("pytorch-container", cpath, "must have at least one container named "
                   "'pytorch'")
        count = rs.get("replicas") if isinstance(rs, dict) else None
        if key == "Master" and count != 1:
            state = "is missing" if count is None else f"is {count!r}"
            yield ("master-replicas", f"{where}.replicas", f"{state}: Master must set "
                   "replicas: 1")
        elif key != "Master" and isinstance(count, int) and count < 1:
            yield ("replicas", f"{where}.replicas", f"is {count}: must be at least 1 (or leave "
                   f"{key} out)")


def runtime(obj: dict[str, Any]) -> Iterator[Rule]:
    """validateReplicatedJobs of the TrainingRuntime/ClusterTrainingRuntime webhook (v2.3.0,
    pkg/webhooks/trainingruntime_webhook.go)."""
    base = "spec.template.spec.replicatedJobs"
    for i, rjob in enumerate(as_list(get_in(obj, "spec", "template", "spec", "replicatedJobs"))):
        ancestor = get_in(rjob, "template", "metadata", "labels", ANCESTOR_LABEL)
        if not isinstance(ancestor, str) or ancestor not in ANCESTOR_CONTAINER:
            continue
        count = rjob.get("replicas", 1)  # the CRD's default, applied before the webhook
        if count != 1:
            yield ("ancestor-replicas", f"{base}[{i}].replicas", f"is {count!r}: the "
                   f"{ancestor} job always must be 1")
        names = [get_in(c, "name") for c in as_list(get_in(rjob, "template", "spec", "template",
                                                     "spec", "containers"))]
        if ANCESTOR_CONTAINER[ancestor] not in names:
            yield ("ancestor-container", f"{base}[{i}].template.spec.template.spec.containers",
                   f"must contain the container {ANCESTOR_CONTAINER[ancestor]!r} for the "
                   f"ancestor {ancestor}")


def trainjob(obj: dict[str, Any], runtimes: Runtimes) -> Iterator[Rule]:
    """The TrainJob webhook (v2.3.0, pkg/webhooks/trainjob_webhook.go): a registered runtime
    kind, then that runtime's plugins (jobset, torch, flux), which need the runtime object: one
    of ``runtimes`` or none. Nothing requires the command to start with torchrun."""
    ref = get_in(obj, "spec", "runtimeRef")
    if not isinstance(ref, dict):
        return
    group = ref.get("apiGroup", GROUP)
    kind, known = referenced(obj, runtimes)
    if group != GROUP or kind not in RUNTIME_KINDS:
        yield ("runtime-ref", "spec.runtimeRef", f"unsupported runtime {kind}.{group}: "
               f"{' or '.join(RUNTIME_KINDS)} of {GROUP}")
        return
    policy = get_in(known, "spec", "mlPolicy")
    framework = next((k for k in ("torch", "mpi", "jax", "xgboost", "flux")
                      if isinstance(policy, dict) and k in policy), None)
    env = as_list(get_in(obj, "spec", "trainer", "env"))
    reserved = sorted({str(e.get("name")) for e in env if isinstance(e, dict)}
                      & set(TORCH_RESERVED))
    if framework == "torch" and reserved:
        yield ("reserved-env", "spec.trainer.env", f"must not set torchrun's reserved "
               f"variables {reserved}: the torch runtime sets them")
    if framework == "flux" and known is not None:
        yield from _flux(obj, known)
    elif isinstance(nproc := get_in(obj, "spec", "trainer", "numProcPerNode"), int) and \
            nproc < 1:
        # not upstream's webhook (v2.3.0 checks it for Flux alone): the job is admitted and its
        # nodes fail at start (torchrun --nproc-per-node 0), so it is refused here
        yield ("nproc", "spec.trainer.numProcPerNode", f"is {nproc}: must be >= 1, the worker "
               "processes per node (torchrun's --nproc-per-node); leave it out for the "
               "runtime's default")
    patches = as_list(get_in(obj, "spec", "runtimePatches"))
    for i, patch in enumerate(patches):
        manager = get_in(patch, "manager")
        why = domain_prefixed_path_problem(manager)
        if why:
            yield ("patch-manager", f"spec.runtimePatches[{i}].manager", why)
    if known is not None:
        yield from _patches_fit(obj, known)


def _flux(obj: dict[str, Any], known: dict[str, Any]) -> Iterator[Rule]:
    """The flux plugin's Validate (v2.3.0 pkg/runtime/framework/plugins/flux/flux.go)."""
    nproc = get_in(obj, "spec", "trainer", "numProcPerNode")
    if nproc is None:
        nproc = get_in(known, "spec", "mlPolicy", "flux", "numProcPerNode")
    if isinstance(nproc, int) and nproc < 1:
        yield ("flux-nproc", "spec.trainer.numProcPerNode", f"is {nproc}: must be >= 1 for a "
               "Flux TrainJob")
    for rjob in as_list(get_in(known, "spec", "template", "spec", "replicatedJobs")):
        inits = as_list(get_in(rjob, "template", "spec", "template", "spec", "initContainers"))
        if get_in(rjob, "name") == "node" and any(get_in(c, "name") == FLUX_INSTALLER
                                                for c in inits):
            yield ("flux-installer", "spec.runtimeRef", f"the runtime's node job has the init "
                   f"container {FLUX_INSTALLER!r}, which the Flux plugin reserves")


def domain_prefixed_path_problem(value: object) -> str | None:
    """validation.IsDomainPrefixedPath: ``host/path``, host a DNS-1123 subdomain."""
    if not isinstance(value, str) or not value:
        return "is required"
    host, slash, path = value.partition("/")
    if not slash or not host or not path:
        return f"{value!r} must be a domain-prefixed path (such as 'acme.io/foo')"
    if subdomain_problem(host):
        return f"{host!r} must be a lowercase RFC 1123 subdomain"
    if not HTTP_PATH.fullmatch(path):
        return f"{path!r} is not a valid path"
    return None


def _patches_fit(obj: dict[str, Any], known: dict[str, Any]) -> Iterator[Rule]:
    """The jobset plugin's checks that need the runtime (jobset.go Validate)."""
    jobs: dict[str, dict[str, list[Any]]] = {}
    for rjob in as_list(get_in(known, "spec", "template", "spec", "replicatedJobs")):
        pod = get_in(rjob, "template", "spec", "template", "spec")
        jobs[str(get_in(rjob, "name"))] = {g: as_list(get_in(pod, g))
                                         for g in ("initContainers", "containers")}
    names = {j: {str(get_in(c, "name")) for g in groups.values() for c in g}
             for j, groups in jobs.items()}
    for step in ("dataset", "model"):
        if get_in(obj, "spec", "initializer", step) is None:
            continue
        job = f"{step}-initializer"
        mounts = [m for c in jobs.get(job, {}).get("containers", [])
                  if get_in(c, "name") == job for m in as_list(get_in(c, "volumeMounts"))]
        if job not in jobs:
            why = f"must have a {job} job when the TrainJob has spec.initializer.{step}"
        elif job not in names[job]:  # names are strings
            why = f"must have a container {job} in the {job} job"
        elif not any(get_in(m, "name") == INITIALIZER_VOLUME for m in mounts):
            why = f"must have a volumeMount {INITIALIZER_VOLUME} in container {job}"
        else:
            continue
        yield ("runtime-initializer", "spec.runtimeRef", why)
    for i, patch in enumerate(as_list(get_in(obj, "spec", "runtimePatches"))):
        for rjob in as_list(get_in(patch, "trainingRuntimeSpec", "template", "spec",
                               "replicatedJobs")):
            where = f"spec.runtimePatches[{i}]"
            job = str(get_in(rjob, "name"))
            if job not in jobs:
                yield ("runtime-patch", where, f"replicated job {job!r} is not in the runtime")
                continue
            pod = get_in(rjob, "template", "spec", "template", "spec")
            for group in ("initContainers", "containers"):
                for c in as_list(get_in(pod, group)):
                    if str(get_in(c, "name")) not in names[job]:
                        yield ("runtime-patch", where, f"{group[:-1]} {get_in(c, 'name')!r} is "
                               f"not in the runtime job {job}")
                    elif group == "containers" and get_in(c, "env") and get_in(c, "name") in (
                            "node", "model-initializer", "dataset-initializer"):
                        yield ("runtime-patch", where, f"must not set env of container "
                               f"{get_in(c, 'name')!r} (use spec.trainer.env)")

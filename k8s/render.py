"""``torchjob render --to k8s[:trainjob]``: the spec checked, the objects rendered and validated,
then their text (one multi-document YAML, submitted as printed). Pure."""

from __future__ import annotations

from typing import Any, Callable

from torchjob.jobs.spec import JobSpec
from torchjob.jobs.checks import gpus_asked
from torchjob.jobs.values import DNS_LABEL_MAX, SpecError, UserError, bad, secret_like_name
from torchjob.k8s.pod import TOPOLOGY_ANNOTATION
from torchjob.k8s.pytorchjob import render_pytorchjob
from torchjob.k8s.store import has_store, render_store
from torchjob.k8s.validate.runtimes import default_runtimes, runtime_key
from torchjob.k8s.trainjob import render_runtime, render_trainjob
from torchjob.k8s.validate import SECRET_VALUE, validate
from torchjob.k8s.yaml import manifests_text

TARGETS: dict[str, Callable[[JobSpec], dict[str, Any]]] = {
    "pytorchjob": render_pytorchjob,
    "trainjob": render_trainjob,
}
# A Service name, and a pod's hostname, is a DNS label: at most 63 characters. The PyTorchJob
# operator names each replica's pod and headless Service <job>-<type>-<index> (lower-case
# type; kubeflow/trainer release-1.9 pkg/common/util GenGeneralName); JobSet's admission
# webhook requires <jobset>-<replicatedJob>-<jobIndex>-<podIndex> plus a 5-character random
# suffix to be a DNS-1035 label (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go,
# "-abcde"); a TrainJob's JobSet has the TrainJob's name, and torch-distributed's one
# ReplicatedJob "node" has 1 Job of numNodes pods.
POD_SUFFIX = "-abcde"
TRAINJOB_NODE = "node"
# Kueue's topology-aware scheduling annotations on a pod template (kueue.sigs.k8s.io, "Run
# Workloads with Topology-Aware Scheduling"); the group name puts a Master and its Workers
# (two PodSets) in one domain.
PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"


def longest_names(spec: JobSpec, target: str) -> list[tuple[str, str]]:
    """(the longest name the operator derives from ``spec.name``, what it is)."""
    nnodes, name = spec.nnodes, spec.name
    if target == "trainjob":
        return [(f"{name}-{TRAINJOB_NODE}-0-{nnodes.max - 1}{POD_SUFFIX}",
                 "the longest pod name JobSet checks (with the 5-character random suffix)")]
    if nnodes.is_elastic or has_store(spec):  # Worker-only (torchjob.k8s.pytorchjob)
        return [(f"{name}-worker-{nnodes.max - 1}", "the last Worker's pod and Service")]
    return [(f"{name}-master-0", "the Master's pod and Service")]


def check_names(spec: JobSpec, target: str) -> None:
    for longest, what in longest_names(spec, target):
        if len(longest) > DNS_LABEL_MAX:
            room = DNS_LABEL_MAX - (len(longest) - len(spec.name))
            raise bad("name", spec.name, f"is {len(spec.name)} characters: {what} would be "
                      f"{longest!r}, {len(longest)} characters, but a DNS label has at most "
                      f"{DNS_LABEL_MAX}; use a name of at most {room} characters")


def check_queue(spec: JobSpec) -> None:
    """Kueue admits a workload by its pods' requests: a pod without cpu or memory requests
    is admitted using none of the queue's quota of them."""
    if not spec.k8s.queue:
        return
    for field in ("cpu", "memory"):
        if getattr(spec.resources, field) is None:
            raise SpecError(f"resources.{field}", f"is unset, but k8s.queue "
                            f"{spec.k8s.queue!r} is set: Kueue admits jobs by their pods' "
                            f"requests, and a pod without a {field} request uses none of the "
                            f"queue's {field} quota; set resources.{field} (e.g. "
                            f"{'8' if field == 'cpu' else '32Gi'})")


def check_env(spec: JobSpec) -> None:
    """A literal value of a secret-named variable, or of a token's shape, is refused: a
    manifest is readable by everyone who may read the job."""
    allowed = set(spec.k8s.allow_literal_env)
    for name, value in spec.env.items():
        if not value or name in allowed:
            continue
        if SECRET_VALUE.search(value):
            raise SpecError(f"env.{name}", "holds a value shaped like a credential (a token "
                            "or a private key): create a Kubernetes Secret and write secrets: "
                            f"[{{env: {name}, secret: NAME, key: KEY}}] instead")
        if secret_like_name(name):
            raise SpecError(f"env.{name}", f"has a literal value, but its name ends in "
                            f"_{name.upper().rsplit('_', 1)[-1]}, as a secret's does: put the "
                            f"value in a Kubernetes Secret and write secrets: [{{env: {name}, "
                            f"secret: NAME, key: KEY}}]; if it is not a secret, list it in "
                            f"k8s.allow_literal_env: [{name}]")


def check(spec: JobSpec, target: str) -> None:
    """What the cluster would refuse or get wrong, before anything is rendered or sent."""
    check_names(spec, target)
    gpus_asked(spec.nproc_per_node, spec.resources.gpus, "Kubernetes")
    check_queue(spec)
    check_env(spec)


def place(spec: JobSpec, job: dict[str, Any]) -> None:
    """Kueue's topology annotations on every replica's pod template (``k8s.topology``)."""
    topology = spec.k8s.topology
    if topology is None or job.get("kind") != "PyTorchJob":
        return
    replicas = job["spec"]["pytorchReplicaSpecs"]
    for replica in replicas.values():
        meta = replica["template"].setdefault("metadata", {})
        annotations = meta.setdefault("annotations", {})
        annotations[TOPOLOGY_ANNOTATION[topology.mode]] = topology.level
        if len(replicas) > 1:
            annotations[PODSET_GROUP] = spec.name


def render_objects(spec: JobSpec, target: str = "pytorchjob") -> list[dict[str, Any]]:
    """The validated objects of ``spec`` (``target``: pytorchjob or trainjob): the job, then,
    for an elastic PyTorchJob, its rendezvous store's Deployment and Service; a TrainJob with a
    Volcano queue or a priority class comes after its own TrainingRuntime (``k8s.trainjob``).
    An object that breaks a rule (a renderer bug) is refused, never printed or submitted."""
    if target not in TARGETS:
        raise UserError(f"unknown Kubernetes target {target!r}; valid: {', '.join(TARGETS)}")
    check(spec, target)
    job = TARGETS[target](spec)
    place(spec, job)
    objs = [job]
    if target == "pytorchjob":
        objs += render_store(spec)
    runtimes = default_runtimes()
    if target == "trainjob" and (runtime := render_runtime(spec)) is not None:
        objs.insert(0, runtime)
        runtimes[runtime_key(runtime)] = runtime
    for obj in objs:
        # secret-literal: check_env's explicit rule (with k8s.allow_literal_env) decided
        problems = [p for p in validate(obj, runtimes=runtimes, runtime_pods=True)
                    if p.rule != "secret-literal"]
        if problems:
            raise UserError(f"the rendered {obj['kind']} breaks {len(problems)} rule(s): "
                            + "; ".join(str(p) for p in problems))
    return objs


def render_manifest(spec: JobSpec, target: str = "pytorchjob") -> str:
    """The validated manifest of ``spec`` as YAML, ready for ``kubectl apply -f -``."""
    return manifests_text(render_objects(spec, target))

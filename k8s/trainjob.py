"""The TrainJob renderer (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer v2.3): the job, and
the TrainingRuntime of its own that some settings need. Pure."""

from __future__ import annotations

import copy

from torchjob.jobs.command import agent_command
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import SpecError
from torchjob.k8s.pod import (WAIT_FOR_HOST, Obj, command_words, metadata, shared_checkpoints,
                              QUEUE_LABEL, container_security, labels, on_cluster, pod_security,
                              TOPOLOGY_ANNOTATION, pod_spec)
from torchjob.k8s.validate.runtimes import default_runtimes

# What v2.3.0 does with a TrainJob (kubeflow/trainer tag v2.3.0, ``pkg/``):
# - The torch plugin (``runtime/framework/plugins/torch/torch.go``, ``EnforceMLPolicy``) sets
#   the node count and injects ``PET_NNODES``, ``PET_NPROC_PER_NODE`` (``trainer.numProcPerNode``,
#   still an int32 in v2.3's ``apis/trainer/v1alpha1/trainjob_types.go``), ``PET_NODE_RANK``,
#   ``PET_MASTER_ADDR`` = ``<job>-node-0-0.<job>`` and ``PET_MASTER_PORT`` into the ``node``
#   container; users may not set those five (``Validate``). It neither wraps nor checks the
#   command (only ``tune run`` is special): any command runs, so every node runs the same agent
#   command as on every other backend (``torchjob.jobs.command``), with the hang watchdog, exit-code
#   mapping, ledger and restart storm guard, and all of torchrun's flags written out (a flag
#   wins over the ``PET_*`` variable). c10d rendezvous at the address the plugin names for node
#   0, on ``rdzv.port``: node 0's agent hosts the store, as in a fixed-size PyTorchJob. Every
#   node first waits until that name resolves (JobSet publishes not-ready addresses, but a pod
#   may start before its DNS record exists, and torch's c10d fails at once on a lookup error).
# - No elastic training: ``numNodes`` is one number and the plugin's PET_NNODES too.
# - Pod settings go through ``spec.runtimePatches`` (``core/trainingruntime.go``,
#   ``mergeRuntimePatches``: a strategic merge into the runtime's JobSet template), which
#   allows, for the pod, only ``serviceAccountName``, ``volumes``, ``securityContext``,
#   ``initContainers``, ``containers`` (name, ``volumeMounts``, ``securityContext``; no env on
#   ``node``), ``imagePullSecrets``, ``nodeSelector``, ``affinity``, ``tolerations``,
#   ``schedulingGates`` and ``terminationGracePeriodSeconds`` (``PodSpecPatch``). So the pod of
#   a PyTorchJob (``k8s.pod.pod_spec``) is split: env and resources into ``trainer``, the rest
#   into one patch owned by ``PATCH_MANAGER``. There is no ``priorityClassName`` in it, nor
#   ``automountServiceAccountToken`` (the runtime's default stays).
# - Volcano acts only for a runtime with ``spec.podGroupPolicy.volcano``
#   (``runtime/framework/plugins/volcano/volcano.go``), which ``torch-distributed`` has not
#   (``manifests/base/runtimes/torch_distributed.yaml``). Its PodGroup takes the queue from the
#   ``scheduling.volcano.sh/queue-name`` annotation of the runtime's ``spec.template.metadata``
#   (runtimePatches may override it; ``core/trainingruntime.go`` ``newRuntimeInfo``) and the
#   priority class from the pod template's ``priorityClassName``; no plugin sets the pods'
#   ``schedulerName`` (the Volcano proposal, ``proposals/2437-volcano-scheduler``, writes
#   ``volcano`` in the runtime). So with ``k8s.volcano_queue`` or ``k8s.priority_class`` a
#   TrainJob gets a namespaced ``TrainingRuntime`` of its own, ``<job>-runtime``: a copy of
#   the vendored ``torch-distributed`` with those set (``render_runtime``), created before the
#   job (the TrainJob webhook refuses a runtime that does not exist yet,
#   ``TrainingRuntime.ValidateObjects``). ``k8s.topology`` goes there too: Kueue's
#   topology-aware scheduling reads its annotation from the node pods' template, which
#   runtimePatches cannot annotate. Without any of them, the stock runtime.

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
RUNTIME = "torch-distributed"
RUNTIME_KIND = "ClusterTrainingRuntime"  # the CRD's default runtimeRef kind: RUNTIME's
OWN_RUNTIME_KIND, OWN_RUNTIME_SUFFIX = "TrainingRuntime", "-runtime"  # a job's own runtime
GROUP = API_VERSION.split("/")[0]
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"  # volcanov1beta1.QueueNameAnnotationKey
VOLCANO_SCHEDULER = "volcano"  # the pods' schedulerName, for Volcano to schedule them
NODE = "node"  # the runtime's trainer replicatedJob and its container (constants.Node)
PATCH_MANAGER = "torchjob.io/render"  # owner of our runtimePatches entry (domain/path)
# What v2.3's runtimePatches may set in the pod (PodSpecPatch) and in a container
# (ContainerPatch) that the PyTorchJob pod has; the node container's env is trainer.env.
POD_PATCH = ("serviceAccountName", "securityContext", "terminationGracePeriodSeconds",
             "volumes")
CONTAINER_PATCH = ("name", "volumeMounts", "securityContext")


def master_host(spec: JobSpec) -> str:
    """Node 0's address, exactly as the torch plugin writes it into PET_MASTER_ADDR."""
    return f"{spec.name}-{NODE}-0-0.{spec.name}"


def command(spec: JobSpec, python: str = "python") -> list[str]:
    """The node container's command (spec already placed on the cluster): wait until node 0
    resolves, then the agent with c10d rendezvous at node 0."""
    host = master_host(spec)
    agent = agent_command(spec, python=python, rdzv_endpoint=f"{host}:{spec.rdzv.port}",
                          run_id=spec.name)
    return [python, "-c", WAIT_FOR_HOST, host, str(spec.k8s.rdzv_wait_seconds), *agent]


def refuse_unsupported(spec: JobSpec) -> None:
    """What a v2.3 TrainJob on the torch-distributed runtime cannot honour: a SpecError that
    names the field and the fix."""
    if spec.nnodes.is_elastic:
        raise SpecError("nnodes", f"{str(spec.nnodes)!r} is elastic, but a TrainJob (Kubeflow "
                        "Trainer v2.3) has no elastic training (one numNodes): use --to k8s (a PyTorchJob with "
                        f"elasticPolicy) or a fixed nnodes such as {spec.nnodes.max}")


def own_runtime_name(spec: JobSpec) -> str | None:
    """The name of the TrainingRuntime ``spec`` needs of its own (the notes above), or None
    when the stock one serves. Never the longest name: the pods' are longer (k8s.render)."""
    if spec.k8s.volcano_queue or spec.k8s.priority_class or spec.k8s.topology is not None:
        return spec.name + OWN_RUNTIME_SUFFIX
    return None


def render_runtime(spec: JobSpec) -> Obj | None:
    """The job's own TrainingRuntime, or None: the vendored torch-distributed with the Volcano
    policy and queue (``k8s.volcano_queue``), the pods' priorityClassName
    (``k8s.priority_class``) and Kueue's topology annotation (``k8s.topology``); labelled as the job, so ``torchjob cancel`` finds it. Its pod
    template is Pod Security "restricted" by itself (the job's runtimePatches say so again)."""
    name = own_runtime_name(spec)
    if name is None:
        return None
    stock = default_runtimes()[(RUNTIME_KIND, "", RUNTIME)]
    body: Obj = copy.deepcopy(stock["spec"])
    template = [job for job in body["template"]["spec"]["replicatedJobs"]
                if job["name"] == NODE][0]["template"]["spec"]["template"]
    pod = template.setdefault("spec", {})
    pod["securityContext"] = pod_security(spec)
    for container in pod["containers"]:
        container["securityContext"] = container_security(spec)
    if spec.k8s.volcano_queue:
        body["podGroupPolicy"] = {"volcano": {}}
        meta = body["template"].get("metadata", {})
        annotations = {**meta.get("annotations", {}), VOLCANO_QUEUE: spec.k8s.volcano_queue}
        body["template"] = {"metadata": {**meta, "annotations": annotations},
                            **{k: v for k, v in body["template"].items() if k != "metadata"}}
        pod["schedulerName"] = VOLCANO_SCHEDULER
    if spec.k8s.priority_class:
        pod["priorityClassName"] = spec.k8s.priority_class
    if spec.k8s.topology is not None:  # Kueue's TAS reads the node pods' template
        annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
        annotations[TOPOLOGY_ANNOTATION[spec.k8s.topology.mode]] = spec.k8s.topology.level
    ours = {key: value for key, value in labels(spec).items() if key != QUEUE_LABEL}
    meta = {"name": name, "namespace": spec.k8s.namespace,
            "labels": {**stock["metadata"].get("labels", {}), **ours}}
    return {"apiVersion": API_VERSION, "kind": OWN_RUNTIME_KIND, "metadata": meta,
            "spec": body}


def runtime_ref(spec: JobSpec) -> Obj:
    own = own_runtime_name(spec)
    if own is None:
        return {"name": RUNTIME}
    return {"apiGroup": GROUP, "kind": OWN_RUNTIME_KIND, "name": own}


def runtime_patch(pod: Obj) -> Obj:
    """Our one runtimePatches entry: the parts of ``pod`` v2.3 lets a TrainJob set, on the
    runtime's ``node`` replicatedJob."""
    node = pod["containers"][0]
    patch: Obj = {key: pod[key] for key in POD_PATCH if key in pod}
    patch["containers"] = [{key: node[key] for key in CONTAINER_PATCH if key in node}]
    job = {"name": NODE, "template": {"spec": {"template": {"spec": patch}}}}
    return {"manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


def render_trainjob(spec: JobSpec) -> Obj:
    """The TrainJob for a fixed-size ``spec``; what v2.3 cannot honour is a SpecError."""
    refuse_unsupported(spec)
    spec = on_cluster(spec)
    shared_checkpoints(spec, spec.nnodes.max)  # the same rule as a PyTorchJob's
    pod = pod_spec(spec, {"name": NODE, "image": spec.image,
                          "command": command_words(command(spec))})
    node = pod["containers"][0]
    trainer: Obj = {"image": node["image"], "command": node["command"],
                    "numNodes": spec.nnodes.max}
    if spec.procs:  # an integer in v2.3; a node that counts its own (cpu): the runtime's
        trainer["numProcPerNode"] = spec.procs  # default, and the command's flag says how
    for ours, theirs in (("env", "env"), ("resources", "resourcesPerNode")):
        if ours in node:
            trainer[theirs] = node[ours]
    body: Obj = {"runtimeRef": runtime_ref(spec), "trainer": trainer,
                 "runtimePatches": [runtime_patch(pod)]}
    if spec.k8s.active_deadline_seconds is not None:
        body["activeDeadlineSeconds"] = spec.k8s.active_deadline_seconds
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(spec), "spec": body}

"""The TrainJob renderer (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer v2). Pure.

Fixed-size jobs only (v2 has no elastic training). The controller does not wrap the command
and requires it to start with ``torchrun``; its torch plugin injects only ``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` (which
users may not set), so the command is the agent command without the topology and
rendezvous flags: torchrun's static rendezvous reads those five. Plain torchrun has no options
for the run's directories either: they go into the trainer's env instead, as the agent would
have exported them (``TORCHJOB_RUN_DIR``, ``TORCHJOB_CHECKPOINT_DIR``). Nor has it a hang
watchdog (``hang_timeout``, trainer.hang): a TrainJob's hung rank is caught only by the
process group's timeout (the trainer's ``--pg-timeout``), which fails the collective and the
pod; the built-in trainer's and ``trainer.progress``' reports then do nothing.
"""

from __future__ import annotations

from jobs.command import agent_command, dir_env
from jobs.spec import JobSpec
from jobs.values import SpecError
from k8s.pod import Obj, command_words, env, env_values, metadata, on_cluster, resources
from trainer.contract import AGENT_ENV_OPTIONS, MAX_STALLED_DEFAULT

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
RUNTIME = "torch-distributed"
# Agent flags left to the PET_* the torch plugin injects (static rendezvous at node 0).
PET_FLAGS = ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
             "--rdzv-conf")


def without_flags(command: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    """``command`` (``python -m trainer.agent`` and ``--flag value`` pairs, then the trainer
    entry and its arguments) with each pair in ``flags`` removed; the entry on is kept."""
    out = list(command[:3])
    i = 3
    while i < len(command) and command[i].startswith("--"):  # the agent's own flags
        if command[i] not in flags:
            out += command[i:i + 2]
        i += 2
    return out + list(command[i:])


def render_trainjob(spec: JobSpec) -> Obj:
    """The TrainJob for a fixed-size ``spec``; an elastic one is a SpecError naming the fix."""
    if spec.nnodes.is_elastic:
        raise SpecError("nnodes", f"{str(spec.nnodes)!r} is elastic, but TrainJob (Kubeflow "
                        "Trainer v2) has no elastic training: use --to k8s (a PyTorchJob with "
                        "elasticPolicy) or a fixed nnodes such as "
                        f"{spec.nnodes.max}")
    for field in ("pvc", "volcano_queue", "priority_class", "service_account"):
        if getattr(spec.k8s, field):
            raise SpecError(f"k8s.{field}", "is not supported by TrainJob, whose pods come "
                            "from the ClusterTrainingRuntime: set it there, or use --to k8s")
    if spec.retry_on_error:
        raise SpecError("retry_on_error", "is not supported by TrainJob, whose nodes run plain "
                        "torchrun: use --to k8s")
    if spec.max_stalled_restarts != MAX_STALLED_DEFAULT:
        raise SpecError("max_stalled_restarts", "is not supported by TrainJob, whose nodes run "
                        "plain torchrun: use --to k8s")
    if spec.mounts:
        raise SpecError("mounts", "TrainJob takes volumes from its runtime; use --to k8s")
    spec = on_cluster(spec)
    agent = agent_command(spec, python="python", rdzv_endpoint="", run_id=spec.name)
    command = ["torchrun", *without_flags(agent, (*PET_FLAGS, *AGENT_ENV_OPTIONS))[3:]]
    trainer: Obj = {"image": spec.image, "command": command_words(command),
                    "numNodes": spec.nnodes.max, "numProcPerNode": spec.nproc_per_node}
    trainer["env"] = env_values(dir_env(spec)) + env(spec)
    res = resources(spec)
    if res:
        trainer["resourcesPerNode"] = res
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(spec),
            "spec": {"runtimeRef": {"name": RUNTIME}, "trainer": trainer}}

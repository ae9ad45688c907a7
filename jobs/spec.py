"""The job spec: one frozen tree that every renderer reads.

Nested frozen, keyword-only dataclasses. Each field carries its help text and, where needed,
a ``parse`` (raw YAML value -> typed value) and a ``check`` (typed value -> ok or SpecError);
``jobs.load`` walks these generically, so a later backend adds a field here and nothing else.
Checks also run when a spec is built in Python, so a JobSpec is valid however it was made.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, ClassVar, Literal

from torchjob.jobs import checks
from torchjob.jobs.trainer_args import Args, check_args, parse_args
from torchjob.jobs.values import (DNS_1035, DNS_LABEL_MAX, MODULE, SECRET_KEY, Check, FrozenMap,
                                  Nnodes, Quantity, SpecError, at_least, bad, between, env_check,
                                  env_map, env_name, label_key, one_line, pattern, positive,
                                  slurm_time)
from torchjob.jobs import timeouts
from torchjob.trainer.contract import (CHECKPOINT_BUDGET_S, COLLECTIVE_TIMEOUT_S, HANG_TIMEOUT_S,
                                       MAX_STALLED_DEFAULT, STOP_GRACE_S)

# The built-in trainer's module. The kit's packages live under torchjob (torchjob.trainer,
# torchjob.jobs, ...), so a user's own trainer.py, jobs/, slurm/ or k8s/ is never confused with
# them.
BUILTIN_MODULE = "torchjob.trainer"


def spec_field(help: str, default: Any = MISSING, *, factory: Callable[[], Any] | None = None,
               check: Check | None = None, parse: Callable[[Any, str], Any] | None = None,
               ) -> Any:
    """A spec field: ``help`` is its documentation; ``parse``/``check`` validate it."""
    meta = {"help": help, "check": check, "parse": parse}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


class Section:
    """Base of every section: freezes mappings and runs each field's check when built."""

    # Keys that must never appear in this section, with the reason and the fix.
    forbidden: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, dict) and not isinstance(value, FrozenMap):
                object.__setattr__(self, f.name, value := FrozenMap(value))
            elif isinstance(value, list):
                object.__setattr__(self, f.name, value := tuple(value))
            if f.metadata.get("check"):
                f.metadata["check"](value, f.name)


@dataclass(frozen=True, kw_only=True)
class Resources(Section):
    cpu: float | None = spec_field("CPUs per node (container, pod or Slurm allocation)", None,
                                   check=positive)
    memory: Quantity | None = spec_field("memory per node, a Kubernetes quantity (512Mi, 4Gi)",
                                         None, parse=Quantity.parse)
    gpus: int = spec_field("GPUs per node", 0, check=at_least(0))
    shm: Quantity = spec_field("size of /dev/shm in containers (DataLoader workers use it)",
                               Quantity("1Gi", 2**30), parse=Quantity.parse)


@dataclass(frozen=True, kw_only=True)
class SecretRef(Section):
    forbidden = {"value": "a secret is never written in a job spec: create a Kubernetes Secret "
                          "(kubectl create secret generic NAME --from-literal=KEY=...) and "
                          "reference it with secret: NAME and key: KEY; pods read it through "
                          "secretKeyRef, local runs from your environment"}
    env: str = spec_field("environment variable the trainer reads the secret from",
                          check=env_name)
    secret: str = spec_field("name of the Kubernetes Secret", check=checks.dns_name)
    key: str = spec_field("key inside the Secret", check=pattern(
        SECRET_KEY, "a Secret key (letters, digits, '-', '_', '.')", "token"))


@dataclass(frozen=True, kw_only=True)
class Mount(Section):
    source: str = spec_field("host path, or volume/PVC name on a cluster",
                             check=checks.mount_source)
    target: str = spec_field("absolute path inside the container", check=checks.mount_target)
    read_only: bool = spec_field("mount read-only", False)


@dataclass(frozen=True, kw_only=True)
class TrainerSection(Section):
    module: str = spec_field("Python module run with -m on every worker", BUILTIN_MODULE,
                             check=pattern(MODULE, "a dotted Python module name",
                                           BUILTIN_MODULE))
    script: str | None = spec_field(
        "a Python script every worker runs instead of module (a path where the job runs: "
        "relative to the working directory, or inside the image)", None,
        check=checks.optional(checks.script))
    args: Args = spec_field(
        "arguments for the module or script: a mapping (grad_accum: 2 becomes --grad-accum 2) "
        "or a list of words passed exactly as written (['10', '--lr=0.1', 'model.depth=4'])",
        factory=FrozenMap, parse=parse_args)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.script is not None and self.module != BUILTIN_MODULE:
            raise bad("script", self.script, f"and module {self.module!r} are both set: a "
                      "worker runs one of them, so remove one")
        check_args(self.args, builtin=self.builtin)

    @property
    def builtin(self) -> bool:
        """Whether the workers run torchjob's own trainer (``module: torchjob.trainer``, no
        script)."""
        return self.script is None and self.module == BUILTIN_MODULE

    @property
    def entry(self) -> tuple[str, ...]:
        """What follows the agent's own flags: ``-m MODULE`` or ``SCRIPT`` (as torchrun)."""
        return (self.script,) if self.script is not None else ("-m", self.module)


@dataclass(frozen=True, kw_only=True)
class Rdzv(Section):
    backend: Literal["c10d", "torchjob"] = spec_field(
        "rendezvous backend: c10d (torch's), or torchjob (a key per node, O(1) store traffic "
        "per node: trainer/rendezvous.py)", "c10d")
    port: int = spec_field("rendezvous port on clusters (local runs pick a free one; on "
                           "Slurm a job takes 12000 + its id % 20000, unless TorchX's is "
                           "given another)", 29400,
                           check=between(1, 65535))
    join_timeout: int = spec_field("seconds to wait for MIN nodes to join", 600,
                                   check=at_least(1))
    last_call_timeout: int = spec_field("seconds to wait for more nodes once MIN joined", 5,
                                        check=at_least(0))


@dataclass(frozen=True, kw_only=True)
class Local(Section):
    nodes: int | None = spec_field("torchrun agents (emulated nodes) on this machine; "
                                   "default: nnodes MAX", None, check=at_least(1))


@dataclass(frozen=True, kw_only=True)
class Slurm(Section):
    partition: str | None = spec_field("sbatch --partition", None, check=one_line)
    account: str | None = spec_field("sbatch --account", None, check=one_line)
    qos: str | None = spec_field("sbatch --qos", None, check=one_line)
    constraint: str | None = spec_field("sbatch --constraint", None, check=one_line)
    time: str | None = spec_field("time limit: minutes or 'HH:MM:SS'", None, parse=slurm_time)
    exclusive: bool = spec_field("sbatch --exclusive", False)
    extra_flags: tuple[str, ...] = spec_field("further sbatch options, e.g. --gres=gpu:1", (),
                                              check=checks.flags)
    signal_delay: int = spec_field("seconds before the time limit at which Slurm sends SIGUSR2 "
                                   "so the trainer checkpoints (0: no signal)", 90,
                                   check=at_least(0))
    max_requeues: int = spec_field("how often a job stopped by its time limit or preemption "
                                   "is requeued to continue from its checkpoint", 3,
                                   check=at_least(0))
    container: Literal["none", "pyxis", "apptainer"] = spec_field(
        "run the agent in a container on each node: pyxis (srun --container-image) or "
        "apptainer (apptainer exec); none runs the nodes' own python", "none")
    container_image: str | None = spec_field(
        "image for slurm.container (e.g. a .sif path or docker://...); default: image", None,
        check=checks.optional(checks.image))


@dataclass(frozen=True, kw_only=True)
class Topology(Section):
    level: str = spec_field("the node label of the topology level (a Kueue Topology's level, "
                            "e.g. cloud.provider.com/topology-rack)", check=label_key)
    mode: Literal["required", "preferred"] = spec_field(
        "required: every pod in one domain of that level, or the job is not admitted; "
        "preferred: as few domains as Kueue can", "required")


@dataclass(frozen=True, kw_only=True)
class K8s(Section):
    namespace: str = spec_field("Kubernetes namespace", "default", check=checks.dns_label)
    queue: str | None = spec_field("Kueue LocalQueue name", None, check=checks.dns_name)
    service_account: str | None = spec_field("pod service account", None, check=checks.dns_name)
    pvc: str | None = spec_field("PersistentVolumeClaim for run_dir and checkpoints", None,
                                 check=checks.dns_name)
    pvc_mount_path: str = spec_field("where the pvc is mounted; a relative run_dir and "
                                     "checkpoint_dir are placed under it", "/mnt/torchjob",
                                     check=checks.mount_target)
    checkpoints: Literal["pvc", "pod-local"] = spec_field(
        "where checkpoints live: pvc (on a PersistentVolumeClaim every pod mounts: k8s.pvc, "
        "ReadWriteMany for several pods, or a writable mounts entry holding checkpoint_dir; a "
        "job of several pods or an elastic one is refused without one) or pod-local (in each "
        "pod, lost with it: no resume across pods, acknowledged)", "pvc")
    restart_policy: Literal["ExitCode", "OnFailure", "Never"] = spec_field(
        "PyTorchJob replica restartPolicy; ExitCode recreates a pod only for exit codes >= 128 "
        "(143: preempted, checkpoint written), never for 1 (failure) or 2 (bad config)",
        "ExitCode")
    backoff_limit: int | None = spec_field("runPolicy.backoffLimit: pod retries before the job "
                                           "fails", 3, check=at_least(0))
    ttl_seconds_after_finished: int | None = spec_field(
        "runPolicy.ttlSecondsAfterFinished: delete the finished job after this many seconds",
        None, check=at_least(0))
    active_deadline_seconds: int | None = spec_field(
        "runPolicy.activeDeadlineSeconds: wall-clock limit of the whole job", None,
        check=at_least(1))
    clean_pod_policy: Literal["None", "Running", "All"] = spec_field(
        "runPolicy.cleanPodPolicy: which pods are deleted when the job finishes", "Running")
    volcano_queue: str | None = spec_field(
        "Volcano queue: a PyTorchJob's runPolicy.schedulingPolicy (gang of nnodes MIN pods); "
        "a TrainJob's own TrainingRuntime with a Volcano podGroupPolicy", None,
        check=checks.dns_name)
    priority_class: str | None = spec_field("PriorityClass of the pods (and of the Volcano "
                                            "gang)", None, check=checks.dns_name)
    run_as_user: int = spec_field("non-zero user id the containers run as (Pod Security "
                                  "restricted)", 1000, check=between(1, 2**31 - 1))
    fs_group: int | None = spec_field("pod fsGroup, so the pvc is writable by run_as_user",
                                      1000, check=checks.optional(between(1, 2**31 - 1)))
    rdzv_wait_seconds: int = spec_field(
        "jobs of several pods: how long a pod waits for the rendezvous store to answer (a "
        "PyTorchJob's <job>-rdzv:<rdzv.port>; a TrainJob's node 0 to resolve) before it starts "
        "the agent", 600, check=at_least(1))
    topology: Topology | None = spec_field(
        "Kueue topology-aware scheduling (needs queue): the pods' placement, {level: NODE "
        "LABEL, mode: required|preferred}", None)
    allow_literal_env: tuple[str, ...] = spec_field(
        "env names whose literal values are not secrets although the names end in _KEY, "
        "_TOKEN, _SECRET, _PASSWORD (which are refused otherwise: use secrets)", (),
        check=checks.env_names)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.topology is not None and not self.queue:
            raise SpecError("topology", "needs k8s.queue: topology-aware scheduling is "
                            "Kueue's, for pods admitted through a LocalQueue; set k8s.queue "
                            "or remove k8s.topology")
        if self.queue and self.volcano_queue:
            raise SpecError("volcano_queue", f"{self.volcano_queue!r} and k8s.queue "
                            f"{self.queue!r} are both set: Kueue and Volcano would each gang-"
                            "schedule the pods; keep one")


# An image repository without a tag: lower case path components (Docker's reference grammar),
# the first one may be a registry host with a port.
IMAGE_REPO = re.compile(r"[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+")


@dataclass(frozen=True, kw_only=True)
class Workspace(Section):
    ship: Literal["auto", "never"] = spec_field(
        "a script or module job on a backend whose nodes run an image (Kubernetes, TorchX's "
        "container schedulers): auto builds an image of the working directory on top of image "
        "when the code is there (render shows it), never uses image as it is", "auto")
    repo: str = spec_field("where the workspace image goes (REGISTRY/REPO is pushed there; "
                           "localhost/... stays on this machine)",
                           "localhost/torchjob-workspace",
                           check=pattern(IMAGE_REPO, "an image repository without a tag",
                                         "registry.example/team/train"))


@dataclass(frozen=True, kw_only=True)
class Docker(Section):
    engine: Literal["auto", "docker", "podman"] = spec_field(
        "container engine; auto prefers podman, then docker", "auto")
    restart: Literal["no", "exit-code"] = spec_field(
        "exit-code: torchjob starts a node container again when it was killed (exit 128+N but "
        "143, as PyTorchJob's ExitCode policy), up to max_restarts; never for a failed (1) or "
        "misconfigured (2) job; no: never", "exit-code")
    mount_workdir: bool | None = spec_field(
        "bind-mount the directory torchjob runs in at the image's working directory "
        "(/workspace), so that your script and code are in the container; unset: when the "
        "job runs your own script or module, not for torchjob's trainer", None)


@dataclass(frozen=True, kw_only=True)
class JobSpec(Section):
    """One distributed training job, independent of where it runs."""

    name: str = spec_field("job name: a DNS-1035 label (lower case, starts with a letter)",
                           check=pattern(DNS_1035, "a job name: lower case letters, digits "
                                         "and '-', starting with a letter, not ending with '-'",
                                         "digits", DNS_LABEL_MAX))
    image: str = spec_field("container image (docker and Kubernetes backends)",
                            "localhost/torchjob:latest", check=checks.image)
    nnodes: Nnodes = spec_field("nodes: N, or MIN:MAX for an elastic job", Nnodes(1, 1),
                                parse=Nnodes.parse)
    nproc_per_node: int | str = spec_field(
        "worker processes per node: a count, or as torchrun takes it, `gpu` (one per GPU), "
        "`cpu` (one per CPU the node's agent may use) or `auto` (`gpu` where the node has a "
        "GPU, else `cpu`), which each node counts when it starts", 1, parse=checks.parse_nproc,
        check=checks.nproc)
    resources: Resources = spec_field("per-node resources", factory=Resources)
    env: Mapping[str, str] = spec_field("environment variables for every worker",
                                        factory=FrozenMap, parse=env_map, check=env_check)
    secrets: tuple[SecretRef, ...] = spec_field("secrets by reference (never by value)", ())
    mounts: tuple[Mount, ...] = spec_field("host paths or volumes to mount", ())
    run_dir: str = spec_field("metrics, summary and plot; default runs/NAME", "")
    checkpoint_dir: str = spec_field("checkpoints; default RUN_DIR/checkpoints", "")
    tensorboard: bool = spec_field(
        "the built-in trainer writes TensorBoard event files under RUN_DIR/tensorboard (train "
        "loss, lr, samples/s; eval loss and score): tensorboard --logdir RUN_DIR/tensorboard. "
        "Needs the tensorboard package where the workers run (pip install "
        "torchjob[tensorboard]; the torchjob image lacks it: build on it with pip install "
        "tensorboard); without it the job stops at its start (exit 2)", False)
    prometheus_dir: str = spec_field(
        "a directory on each node where the built-in trainer's first worker there keeps "
        "torchjob_JOB_nodeN.prom for a node exporter's textfile collector (step, loss, lr, "
        "samples/s, eval scores, restarts, last hang, time of the update; labels job, node, "
        "rank); on an image backend, mount the collector's directory there. '': off", "",
        check=checks.prometheus_dir)
    exporters: tuple[str, ...] = spec_field(
        "your own metrics exporters for the built-in trainer, 'pkg.module:Class' each "
        "(torchjob.trainer.exporters.Exporter, importable where the workers run): rank 0 hands "
        "each the records of metrics.jsonl. Example: "
        "torchjob.jobs.examples.mlflow_exporter:MLflowExporter", (), check=checks.exporters)
    max_restarts: int = spec_field("restarts of the whole worker group after a worker was "
                                   "killed or lost", 3, check=at_least(0))
    max_stalled_restarts: int = spec_field(
        "restart storm guard: restarts in a row that come back to the same checkpoint before "
        "the job stops (exit 1) instead of restarting again; counted across requeues and pod "
        "restarts in RUN_DIR/ledger.jsonl; 0 turns it off", MAX_STALLED_DEFAULT,
        check=at_least(0))
    retry_on_error: bool = spec_field("restart also when user code raised (for flaky code; "
                                      "by default an exception fails the job at once)", False)
    hang_timeout: float = spec_field(
        "seconds without progress before the job counts as hung: the stacks of every rank go "
        "to RUN_DIR/hangs, the stuck rank is named and the workers restart from the last "
        "checkpoint. Progress: a finished step (the built-in trainer reports each; a script "
        "calls torchjob.trainer.progress.step()), before the first step a rank's heartbeat. "
        "Above your longest gap between two steps (evaluation, blocking saves), below "
        "collective_timeout (checked). 0: off", HANG_TIMEOUT_S, check=checks.hang_timeout)
    collective_timeout: float = spec_field(
        "seconds a collective (all-reduce, barrier, ...) may wait before it fails: the built-in "
        "trainer's --pg-timeout and a script's default process-group timeout",
        COLLECTIVE_TIMEOUT_S, check=checks.seconds)
    checkpoint_budget: float = spec_field(
        "seconds a worker has after a stop signal to finish its step and write its checkpoint "
        "before it exits without one (the built-in trainer's --stop-grace); below stop_grace "
        "and slurm.signal_delay (checked)", CHECKPOINT_BUDGET_S, check=checks.seconds)
    stop_grace: int = spec_field(
        "seconds between a stop signal and the kill: Kubernetes pods' "
        "terminationGracePeriodSeconds, docker stop -t and local runs (run --grace overrides "
        "it)", STOP_GRACE_S, check=at_least(1))
    resume: str = spec_field(
        "checkpoints of another configuration: auto (refused, exit 2), force (resumed anyway) "
        "or fresh (moved aside once per submission; start over); torchjob run --fresh and "
        "--resume=force set it", "auto", check=checks.resume)
    trainer: TrainerSection = spec_field("what every worker runs", factory=TrainerSection)
    rdzv: Rdzv = spec_field("rendezvous settings", factory=Rdzv)
    local: Local = spec_field("local backend settings", factory=Local)
    slurm: Slurm = spec_field("Slurm backend settings", factory=Slurm)
    k8s: K8s = spec_field("Kubernetes backend settings", factory=K8s)
    docker: Docker = spec_field("docker/podman backend settings", factory=Docker)
    workspace: Workspace = spec_field("the working directory shipped to nodes that run an "
                                      "image (jobs.workspace)", factory=Workspace)

    def __post_init__(self) -> None:
        super().__post_init__()
        run_dir = self.run_dir or f"runs/{self.name}"
        object.__setattr__(self, "run_dir", run_dir)
        object.__setattr__(self, "checkpoint_dir", self.checkpoint_dir or f"{run_dir}/checkpoints")
        checks.own_dir(self.run_dir, "run_dir")
        checks.own_dir(self.checkpoint_dir, "checkpoint_dir")
        nodes = self.nnodes.max if self.local.nodes is None else self.local.nodes
        if not self.nnodes.min <= nodes <= self.nnodes.max:
            raise bad("local.nodes", nodes, f"is outside nnodes {self.nnodes}: it must lie "
                      f"between {self.nnodes.min} and {self.nnodes.max}")
        object.__setattr__(self, "local", dataclasses.replace(self.local, nodes=nodes))
        checks.gpu_layout(self.nproc_per_node, self.resources.gpus, self.trainer.builtin)
        for name in ("tensorboard", "prometheus_dir", "exporters"):
            if getattr(self, name) and not self.trainer.builtin:
                raise bad(name, getattr(self, name), "is a setting of the built-in trainer "
                          "(module: torchjob.trainer), but this job runs its own "
                          f"{'script' if self.trainer.script else 'module'}, which exports "
                          "its metrics itself: remove it")
        seen: set[str] = set(self.env)
        for i, ref in enumerate(self.secrets):
            if ref.env in seen:
                raise bad(f"secrets[{i}].env", ref.env, "is already set (in env or by another "
                          "secret); each variable comes from one place")
            seen.add(ref.env)
        targets: set[str] = set()
        for i, mount in enumerate(self.mounts):
            if mount.target in targets:
                raise bad(f"mounts[{i}].target", mount.target, "is mounted twice")
            targets.add(mount.target)
        timeouts.check(timeouts.resolve(self))

    @property
    def procs(self) -> int | None:
        """Worker processes per node, where known before the job runs: the count, or for
        ``gpu``/``auto`` the GPUs it asks for; None: each node counts its own at start."""
        n = self.nproc_per_node
        if isinstance(n, int):
            return n
        return self.resources.gpus if n != "cpu" and self.resources.gpus else None

    @property
    def procs_text(self) -> str:
        """``nproc_per_node`` for a person: "2 process(es)", "one process per GPU"."""
        n = self.nproc_per_node
        return f"{n} process(es)" if isinstance(n, int) else checks.NPROC_WORDS[n]

    @property
    def local_nodes(self) -> int:
        """How many torchrun agents the local backend starts (``local.nodes``, resolved)."""
        return self.local.nodes or self.nnodes.max


def reference() -> str:
    """Every spec field as a Markdown table (field, default, what it is), from the dataclasses'
    help: docs/spec.md's reference (``python -m torchjob.jobs.spec``)."""
    rows = ["| field | default | what it is |", "|---|---|---|"]

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            path = f"{prefix}{f.name}"
            hint = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
            nested = globals().get(hint) if isinstance(hint, str) else None
            if isinstance(nested, type) and issubclass(nested, Section):
                walk(nested, f"{path}.")
                continue
            if f.default is not MISSING:
                default = f.default
            elif f.default_factory is not MISSING:
                default = f.default_factory()
            else:
                default = "(required)"
            shown = "" if default in ("", None, (), {}) else \
                str(default) if not isinstance(default, tuple) else list(default)
            text = str(f.metadata.get("help", "")).replace("|", "\\|")
            rows.append(f"| `{path}` | {f'`{shown}`' if shown != '' else ''} | {text} |")
    walk(JobSpec, "")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m torchjob.jobs.spec: the reference table
    print(reference(), end="")

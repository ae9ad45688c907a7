"""The job spec loader: every field's happy path, and one clear message for each mistake."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest

from torchjob.jobs.load import SpecError, load, loads
from torchjob.jobs.spec import JobSpec, Section
from torchjob.jobs.trainer_args import trainer_argv
from torchjob.jobs.values import FrozenMap, Nnodes, Quantity

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"

FULL = """
name: full-job
image: registry.example.com/team/torchjob:1.2
nnodes: "2:4"
nproc_per_node: 8
resources: {cpu: 7.5, memory: 64Gi, gpus: 8, shm: 8Gi}
env: {NCCL_DEBUG: INFO, LEVEL: 3, RATIO: 0.5, FLAG: true}
secrets:
  - {env: HF_TOKEN, secret: hf-credentials, key: token}
mounts:
  - {source: /scratch/data, target: /data, read_only: true}
  - {source: team-pvc, target: /work}
run_dir: /shared/runs/full
max_restarts: 0
trainer:
  module: torchjob.trainer
  args: {epochs: 3, grad_accum: 2, lr: 1e-3, resume: false, schedule: constant}
rdzv: {backend: c10d, port: 29500, join_timeout: 900, last_call_timeout: 10}
local: {nodes: 3}
slurm: {partition: gpu, account: proj1, qos: high, constraint: "a100|h100", time: "12:00:00",
        exclusive: true, extra_flags: ["--gres=gpu:8", "--mail-type=END"]}
k8s: {namespace: team-a, queue: team-a-queue, service_account: trainer, pvc: team-pvc}
docker: {engine: podman, restart: "no"}
"""


def test_minimal_spec_takes_every_default() -> None:
    spec = loads("name: x")
    assert spec.name == "x"
    assert spec.image == "localhost/torchjob:latest"
    assert spec.nnodes == Nnodes(1, 1) and not spec.nnodes.is_elastic
    assert spec.nproc_per_node == 1
    assert spec.resources.cpu is None and spec.resources.memory is None
    assert spec.resources.gpus == 0 and spec.resources.shm.bytes == 2**30
    assert dict(spec.env) == {} and spec.secrets == () and spec.mounts == ()
    assert (spec.run_dir, spec.checkpoint_dir) == ("runs/x", "runs/x/checkpoints")
    assert spec.max_restarts == 3
    assert spec.trainer.module == "torchjob.trainer" and dict(spec.trainer.args) == {}
    assert (spec.rdzv.backend, spec.rdzv.port, spec.rdzv.join_timeout,
            spec.rdzv.last_call_timeout) == ("c10d", 29400, 600, 5)
    assert spec.local.nodes == 1 == spec.local_nodes
    assert spec.slurm.partition is None and spec.slurm.extra_flags == ()
    assert spec.slurm.time is None and spec.slurm.exclusive is False
    assert spec.k8s.namespace == "default" and spec.k8s.pvc is None
    assert (spec.docker.engine, spec.docker.restart) == ("auto", "exit-code")
    assert spec == JobSpec(name="x")


def test_every_field_set() -> None:
    spec = loads(FULL)
    assert spec.image == "registry.example.com/team/torchjob:1.2"
    assert (spec.nnodes.min, spec.nnodes.max, str(spec.nnodes)) == (2, 4, "2:4")
    assert spec.nnodes.is_elastic and spec.nproc_per_node == 8
    assert spec.resources.cpu == 7.5 and spec.resources.gpus == 8
    assert spec.resources.memory == Quantity("64Gi", 64 * 2**30)
    assert spec.resources.shm.mib == 8192
    assert dict(spec.env) == {"NCCL_DEBUG": "INFO", "LEVEL": "3", "RATIO": "0.5", "FLAG": "true"}
    assert [(s.env, s.secret, s.key) for s in spec.secrets] == [("HF_TOKEN", "hf-credentials",
                                                                 "token")]
    assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [
        ("/scratch/data", "/data", True), ("team-pvc", "/work", False)]
    assert spec.run_dir == "/shared/runs/full"
    assert spec.checkpoint_dir == "/shared/runs/full/checkpoints"
    assert spec.max_restarts == 0
    assert dict(spec.trainer.args) == {"epochs": 3, "grad_accum": 2, "lr": 0.001,
                                       "resume": False, "schedule": "constant"}
    assert (spec.rdzv.port, spec.rdzv.join_timeout, spec.rdzv.last_call_timeout) == (29500,
                                                                                     900, 10)
    assert spec.local.nodes == 3
    assert (spec.slurm.partition, spec.slurm.account, spec.slurm.qos) == ("gpu", "proj1", "high")
    assert spec.slurm.constraint == "a100|h100" and spec.slurm.time == "12:00:00"
    assert spec.slurm.exclusive and spec.slurm.extra_flags == ("--gres=gpu:8", "--mail-type=END")
    assert (spec.k8s.namespace, spec.k8s.queue, spec.k8s.service_account, spec.k8s.pvc) == (
        "team-a", "team-a-queue", "trainer", "team-pvc")
    assert (spec.docker.engine, spec.docker.restart) == ("podman", "no")


@pytest.mark.parametrize("raw, low, high, text", [
    ("2", 2, 2, "2"), ('"3"', 3, 3, "3"), ('"1:4"', 1, 4, "1:4"), ("1:4", 1, 4, "1:4"),
    ("'2:2'", 2, 2, "2"),
])
def test_nnodes_forms(raw: str, low: int, high: int, text: str) -> None:
    spec = loads(f"name: x\nnnodes: {raw}")
    assert (spec.nnodes.min, spec.nnodes.max, str(spec.nnodes)) == (low, high, text)
    assert spec.local.nodes == high


@pytest.mark.parametrize("raw, size", [
    ("512Mi", 512 * 2**20), ("4Gi", 4 * 2**30), ("1G", 10**9), ("1073741824", 2**30),
    ("1.5Gi", 3 * 2**29), ("100k", 10**5),
])
def test_memory_quantities(raw: str, size: int) -> None:
    memory = loads(f"name: x\nresources: {{memory: {raw}}}").resources.memory
    assert memory is not None and memory.bytes == size and str(memory) == raw


def test_slurm_time_forms() -> None:
    assert loads("name: x\nslurm: {time: 90}").slurm.time == "90"
    assert loads("name: x\nslurm: {time: 01:30:00}").slurm.time == "01:30:00"
    assert loads("name: x\nslurm: {time: '2-00:00:00'}").slurm.time == "2-00:00:00"


def test_yaml_1_2_scalars() -> None:
    """yes/no/on stay strings (no Norway problem); 1e-3 is a float; 0755 is decimal."""
    spec = loads("name: x\nenv: {A: yes, B: no, C: on, D: 0755, E: 1e-3}")
    assert dict(spec.env) == {"A": "yes", "B": "no", "C": "on", "D": "755", "E": "0.001"}


def test_run_dir_and_checkpoint_dir() -> None:
    spec = loads("name: x\nrun_dir: out/a")
    assert (spec.run_dir, spec.checkpoint_dir) == ("out/a", "out/a/checkpoints")
    spec = loads("name: x\ncheckpoint_dir: /ckpt")
    assert (spec.run_dir, spec.checkpoint_dir) == ("runs/x", "/ckpt")


def test_other_modules_take_any_scalar_args() -> None:
    spec = loads("name: x\ntrainer: {module: my.pkg.train, args: {depth: 3, mode: fast}}")
    assert trainer_argv(spec.trainer.args) == ["--depth", "3", "--mode", "fast"]


def test_trainer_argv_order_dashes_and_bools() -> None:
    args: dict[str, str | bool | int | float] = {
        "grad_accum": 2, "sync_bn": True, "resume": False, "lr": 0.5, "task": "digits"}
    assert trainer_argv(args) == ["--grad-accum", "2", "--sync-bn", "true", "--resume",
                                  "false", "--lr", "0.5", "--task", "digits"]


def test_overrides_take_precedence_over_the_file() -> None:
    text = "name: x\nnnodes: 2\ntrainer: {args: {epochs: 5, lr: 0.1}}\nenv: {A: '1'}"
    spec = loads(text, ["nnodes=1:3", "trainer.args.epochs=3", "trainer.args.seed=7",
                        "env.FOO=bar", "env.A=2", "k8s={namespace: team-b}", "slurm.time=60"])
    assert str(spec.nnodes) == "1:3"
    assert list(spec.trainer.args.items()) == [("epochs", 3), ("lr", 0.1), ("seed", 7)]
    assert dict(spec.env) == {"A": "2", "FOO": "bar"}
    assert spec.k8s.namespace == "team-b" and spec.slurm.time == "60"
    assert loads("name: x", ["name=y"]).name == "y"
    assert loads("name: x", ["resources.cpu="]).resources.cpu is None


def test_override_does_not_leak_through_yaml_aliases() -> None:
    text = "name: x\nenv: &shared {A: '1'}\ntrainer: {module: tool, args: *shared}"
    spec = loads(text, ["env.B=2"])
    assert dict(spec.env) == {"A": "1", "B": "2"}
    assert dict(spec.trainer.args) == {"A": "1"}


def test_load_from_file_path_and_text(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: from-file\n")
    assert load(path).name == "from-file"
    assert load(str(path), ["nproc_per_node=2"]).nproc_per_node == 2
    assert load("name: from-text").name == "from-text"


def test_examples_load() -> None:
    default = load(EXAMPLES / "default.yaml")
    assert (default.name, str(default.nnodes), default.nproc_per_node) == ("digits", "1", 2)
    assert default.max_restarts == 3 and default.trainer.args["epochs"] == 12
    elastic = load(EXAMPLES / "elastic.yaml")
    assert (elastic.name, str(elastic.nnodes), elastic.local.nodes) == ("digits-elastic",
                                                                        "1:2", 2)


def test_spec_is_frozen_hashable_copyable() -> None:
    spec = loads(FULL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.env["X"] = "1"  # type: ignore[index]
    assert hash(spec) == hash(loads(FULL))
    assert copy.deepcopy(spec) == spec == pickle.loads(pickle.dumps(spec))
    assert dataclasses.asdict(spec)["trainer"]["args"]["epochs"] == 3
    assert isinstance(JobSpec(name="x", env={"A": "1"}).env, FrozenMap)


def _sections(cls: Any) -> list[Any]:
    out = [cls]
    for f in dataclasses.fields(cls):
        if isinstance(f.default_factory, type) and issubclass(f.default_factory, Section):
            out += _sections(f.default_factory)
    return out


def test_every_field_has_help() -> None:
    from torchjob.jobs.spec import Mount, SecretRef
    for cls in _sections(JobSpec) + [Mount, SecretRef]:
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


# ------------------------------------------------------------------------------ errors

BRIEF_EXAMPLE = ("job.yaml: nnodes: '3:2' is not a node range: MIN must be <= MAX "
                 "(write N or MIN:MAX, e.g. 2 or 1:4)")


def test_error_message_shape() -> None:
    with pytest.raises(SpecError) as info:
        loads('name: x\nnnodes: "3:2"', source="job.yaml")
    assert str(info.value) == BRIEF_EXAMPLE
    assert info.value.path == "nnodes"


BAD = [  # (yaml, fragments the one-line message must contain)
    ("name: x\nnprocs_per_node: 2", ["nprocs_per_node: unknown key", "valid keys: name,",
                                     "did you mean 'nproc_per_node'"]),
    ("name: x\nresources: {gpu: 1}", ["resources.gpu: unknown key", "did you mean 'gpus'"]),
    ("name: x\nslurm: {partitions: a}", ["slurm.partitions", "did you mean 'partition'"]),
    ('name: x\nnnodes: "0"', ["nnodes: '0'", "MIN must be >= 1"]),
    ("name: x\nnnodes: 0", ["nnodes: 0", "MIN must be >= 1"]),
    ("name: x\nnnodes: -1", ["nnodes: -1", "write N or MIN:MAX"]),
    ("name: x\nnnodes: a", ["nnodes: 'a'", "write N or MIN:MAX"]),
    ('name: x\nnnodes: "1:"', ["nnodes: '1:'", "write N or MIN:MAX"]),
    ("name: x\nnnodes: true", ["nnodes: True", "a boolean"]),
    ("name: x\nnnodes: 1.5", ["nnodes: 1.5", "a number"]),
    ("name: x\nresources: {cpu: -1}", ["resources.cpu: -1", "must be > 0"]),
    ("name: x\nresources: {cpu: 0}", ["resources.cpu: 0", "must be > 0"]),
    ("name: x\nresources: {gpus: -1}", ["resources.gpus: -1", ">= 0"]),
    ("name: x\nnproc_per_node: 4\nresources: {gpus: 2}",
     ["nproc_per_node: 4 is more than resources.gpus (2)", "NCCL", "nproc_per_node: 2"]),
    ("name: x\nnproc_per_node: 2\nresources: {gpus: 8}",
     ["nproc_per_node: 2 is fewer than resources.gpus (8)", "built-in trainer", "idle"]),
    ("name: x\nnproc_per_node: 3\nresources: {gpus: 8}\ntrainer: {script: t.py}",
     ["nproc_per_node: 3 does not divide resources.gpus (8)", "a divisor of 8"]),
    ("name: x\nk8s: {allow_literal_env: [1X]}", ["k8s.allow_literal_env[0]: '1X'"]),
    ("name: x\nk8s: {queue: q, topology: {level: 'a b'}}", ["k8s.topology.level: 'a b'"]),
    ("name: x\nk8s: {queue: q, topology: {level: r, mode: strict}}",
     ["k8s.topology.mode: 'strict'", "'required', 'preferred'"]),
    ("name: x\nresources: {memory: lots}", ["resources.memory: 'lots'", "512Mi"]),
    ("name: x\nresources: {memory: -1Gi}", ["resources.memory: '-1Gi'", "quantity"]),
    ("name: x\nresources: {memory: 0}", ["resources.memory: 0", "positive"]),
    ("name: x\nresources: {shm: 1GB}", ["resources.shm: '1GB'", "quantity"]),
    ("name: \"a'; rm -rf /\"", ["name: \"a'; rm -rf /\"", "not a job name", "e.g. digits"]),
    ("name: a b", ["name: 'a b'", "not a job name"]),
    ("name: A", ["name: 'A'", "lower case"]),
    ("name: -a", ["name: '-a'", "starting with a letter"]),
    ("name: a-", ["name: 'a-'", "not a job name"]),
    (f"name: {'a' * 64}", ["name: 'aaaa", "at most 63 characters"]),
    ("name: 7", ["name: 7", "is an integer, but a string is expected (quote it)"]),
    ("image: x", ["name: is missing"]),
    ("name: x\nnproc_per_node: two", ["nproc_per_node: 'two' is a string, but a process count",
                                      "gpu, cpu, auto"]),
    ("name: x\nnproc_per_node: true", ["nproc_per_node: True is a boolean, but a process"]),
    ("name: x\nnproc_per_node: cpu\nresources: {gpus: 2}",
     ["nproc_per_node: 'cpu' starts one process per CPU", "share a GPU", "nproc_per_node: gpu"]),
    ("name: x\nnproc_per_node: 0", ["nproc_per_node: 0", ">= 1"]),
    ("name: x\nmax_restarts: -1", ["max_restarts: -1", ">= 0"]),
    ("name: x\nenv: [A, B]", ["env: ['A', 'B'] is a list, but a mapping"]),
    ("name: x\nresources: 5", ["resources: 5 is an integer, but a mapping"]),
    ("name: x\ntrainer: [a]", ["trainer: ['a'] is a list, but a mapping"]),
    ("name: x\nmounts: {source: a}", ["mounts: {'source': 'a'} is a mapping, but a list"]),
    ("name: x\nimage: 'a b'", ["image: 'a b'", "image reference"]),
    ("name: x\nenv: {1BAD: x}", ["env.1BAD", "environment variable name"]),
    ("name: x\nenv: {RANK: '0'}", ["env.RANK", "set by the launcher"]),
    ("name: x\nenv: {A: [1]}", ["env.A: [1] is a list"]),
    ('name: x\nenv: {"a\\nb": 1}', ["env.a\\nb: 'a\\nb' is not an environment variable"]),
    ("name: x\nenv: {A: }", ["env.A: None", "write '' for empty"]),
    ("name: x\ntrainer: {args: {epoch: 2}}", ["trainer.args.epoch", "not a trainer argument",
                                              "did you mean 'epochs'"]),
    ("name: x\ntrainer: {args: {epochs: two}}", ["trainer.args.epochs: 'two' is a string",
                                                 "--epochs takes an integer"]),
    ("name: x\ntrainer: {args: {epochs: true}}", ["trainer.args.epochs: True is a boolean"]),
    ("name: x\ntrainer: {args: {lr: fast}}", ["trainer.args.lr: 'fast'", "a number"]),
    ("name: x\ntrainer: {args: {schedule: linear}}", ["trainer.args.schedule: 'linear'",
                                                      "invalid choice", "cosine"]),
    ("name: x\ntrainer: {args: {epochs: 0}}", ["trainer.args.epochs: 0", "must be >= 1"]),
    ("name: x\ntrainer: {args: {run_dir: /r}}", ["trainer.args.run_dir", "top level"]),
    ("name: x\ntrainer: {args: {checkpoint_dir: c}}", ["trainer.args.checkpoint_dir",
                                                       "top level"]),
    ("name: x\ntrainer: {args: {epochs: [1]}}", ["trainer.args.epochs: [1] is a list, but a "
                                                  "single value"]),
    ("name: x\ntrainer: {module: 'a b'}", ["trainer.module: 'a b'", "Python module"]),
    ("name: x\nsecrets: [{env: T, secret: s, key: k, value: hunter2}]",
     ["secrets[0].value", "Kubernetes Secret", "secretKeyRef"]),
    ("name: x\nsecrets: [{env: T, secret: s}]", ["secrets[0].key: is missing"]),
    ("name: x\nsecrets: [{env: 'A B', secret: s, key: k}]", ["secrets[0].env: 'A B'"]),
    ("name: x\nsecrets: [{env: T, secret: Bad_Name, key: k}]", ["secrets[0].secret"]),
    ("name: x\nenv: {T: a}\nsecrets: [{env: T, secret: s, key: k}]",
     ["secrets[0].env: 'T' is already set"]),
    ("name: x\nmounts: [{source: a, target: data}]", ["mounts[0].target: 'data'", "absolute"]),
    ("name: x\nmounts: [{source: a}]", ["mounts[0].target: is missing"]),
    ("name: x\nmounts: [{source: 'a:b', target: /d}]", ["mounts[0].source"]),
    ("name: x\nnnodes: 1:2\nlocal: {nodes: 3}", ["local.nodes: 3", "between 1 and 2"]),
    ("name: x\nnnodes: 2:3\nlocal: {nodes: 1}", ["local.nodes: 1", "between 2 and 3"]),
    ("name: x\nlocal: {nodes: 0}", ["local.nodes: 0", ">= 1"]),
    ("name: x\nrdzv: {backend: etcd}", ["rdzv.backend: 'etcd'", "must be one of 'c10d'"]),
    ("name: x\nrdzv: {port: 0}", ["rdzv.port: 0", "between 1 and 65535"]),
    ("name: x\nrdzv: {port: 70000}", ["rdzv.port: 70000", "between 1 and 65535"]),
    ("name: x\nk8s: {namespace: Team}", ["k8s.namespace: 'Team'", "Kubernetes name"]),
    ("name: x\ndocker: {engine: rkt}", ["docker.engine: 'rkt'", "'podman'"]),
    ("name: x\ndocker: {restart: always}", ["docker.restart: 'always'", "'exit-code'"]),
    ("name: x\nslurm: {time: soon}", ["slurm.time: 'soon'", "HH:MM:SS"]),
    ("name: x\nslurm: {exclusive: yes}", ["slurm.exclusive: 'yes'", "true or false"]),
    ("name: x\nslurm: {extra_flags: [gres]}", ["slurm.extra_flags[0]: 'gres'", "--gres"]),
    ("name: x\nslurm: {partition: \"a\\nb\"}", ["slurm.partition", "single line"]),
    ("name: x\nname: y", ["duplicate key 'name'", "line 2"]),
    ("name: x\nenv: {A: 1, A: 2}", ["duplicate key 'A'"]),
    ("name: [x", ["not valid YAML"]),
    ("- name: x", ["top level must be a mapping"]),
    ("just text", ["'just text' is not a job spec"]),
    ("", ["is empty"]),
    ("name: x\n---\nname: y", ["not valid YAML: expected a single document"]),
    ("name: x\n1: 2", ["1: unknown key"]),
]


@pytest.mark.parametrize("text, fragments", BAD, ids=[t for t, _ in BAD])
def test_bad_spec_gives_one_clear_line(text: str, fragments: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        loads(text, source="job.yaml")
    message = str(info.value)
    assert message.startswith("job.yaml: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


BAD_SET = [
    ("nnodes", ["--set: 'nnodes' has no '='", "--set key=value"]),
    ("nnodez=2", ["--set: nnodez: unknown key", "did you mean 'nnodes'"]),
    ("trainer.argz.epochs=2", ["--set: trainer.argz: unknown key", "did you mean 'args'"]),
    ("nnodes.min=2", ["--set: nnodes: has no keys inside"]),
    ("secrets.0.env=A", ["--set: secrets: has no keys inside: it is a list"]),
    ("env.=1", ["--set: env", "empty key"]),
    ("=1", ["--set", "empty key"]),
    ("nnodes=3:2", ["--set: nnodes: '3:2'", "MIN must be <= MAX"]),
    ("trainer.args.epochs=zero", ["--set: trainer.args.epochs: 'zero'"]),
    ("trainer.args.epoch=3", ["--set: trainer.args.epoch", "did you mean 'epochs'"]),
    ("env.FOO=[a", ["--set env.FOO: is not valid YAML"]),
]


@pytest.mark.parametrize("override, fragments", BAD_SET, ids=[o for o, _ in BAD_SET])
def test_bad_override(override: str, fragments: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        loads("name: x", [override], source="job.yaml")
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="is a directory"):
        load(tmp_path)
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError, match="not UTF-8"):
        load(tmp_path / "latin1.yaml")


def test_gpus_per_node_and_processes_per_node_agree() -> None:
    """One process per GPU; a script or module may drive several GPUs per process, in equal
    shares (the refusals are in BAD)."""
    assert loads("name: x\nnproc_per_node: 8\nresources: {gpus: 8}").nproc_per_node == 8
    assert loads("name: x\nnproc_per_node: 2\nresources: {gpus: 8}\n"
                 "trainer: {script: t.py}").resources.gpus == 8
    assert loads("name: x\nnproc_per_node: 4").resources.gpus == 0  # CPU: any count


@pytest.mark.parametrize("text, value, procs", [
    ("gpu", "gpu", None), ("cpu", "cpu", None), ("auto", "auto", None), ("'4'", 4, 4),
    ("gpu\nresources: {gpus: 4}", "gpu", 4), ("auto\nresources: {gpus: 2}", "auto", 2)])
def test_processes_per_node_as_torchrun_takes_them(text: str, value: object,
                                                   procs: int | None) -> None:
    """torchrun's words (and a PyTorchJob's quoted count): each node counts its own, unless
    the job asks for its GPUs (then one process per GPU asked for is known before it runs)."""
    spec = loads(f"name: x\nnproc_per_node: {text}")
    assert (spec.nproc_per_node, spec.procs) == (value, procs)

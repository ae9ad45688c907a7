"""The Backend contract, for every registered backend: found by name, handles that name their
backend, and what ``render`` prints is what ``submit`` sends. Backend-specific proofs on a
real engine live with each backend (the Slurm devcluster, podman, local torchrun); here the
Kubernetes one runs against the API EMULATOR (tests/k8s/emulator.py: no API server can run
on these machines)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from torchjob.jobs import backend as registry
from torchjob.jobs.backend import Backend, BackendError, Context, Handle
from torchjob.jobs.load import load
from torchjob.jobs.values import SpecError
from torchjob.trainer.env import slurm_port
from tests.jobs.arrival import arrival
from tests.k8s.emulator import Emulator
from tests.procs import torchjob

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "jobs" / "examples" / "default.yaml"
FAMILIES = ["docker", "k8s", "local", "slurm", "torchx"]
RENDERABLE = ["local", "docker", "slurm", "slurm:sbatch", "torchx", "torchx:local_cwd", "k8s",
              "k8s:trainjob"]


def test_the_registry_holds_every_backend_and_each_keeps_the_contract() -> None:
    assert registry.names() == FAMILIES
    for name in RENDERABLE:
        backend = registry.get(name)
        assert isinstance(backend, Backend) and backend.name == name


def test_a_backend_must_render_and_submit_and_the_rest_says_what_to_use() -> None:
    class Partial(Backend):
        name = "partial"

        def render(self, spec: object, context: object) -> object:  # type: ignore[override]
            return None
    with pytest.raises(TypeError, match="submit"):
        Partial()  # type: ignore[abstract]

    class Bare(Partial):
        def submit(self, request: object) -> Handle:  # type: ignore[override]
            return Handle(self.name, "1")
    with pytest.raises(BackendError, match="backend 'partial' has no list"):
        Bare().list()


# What fits refuses, render, run, submit and validate refuse alike, each with exit 2 and
# nothing started (TorchX's Slurm scheduler cannot pass a ',' in a variable: its fits).
@pytest.mark.parametrize("command", [["render"], ["run"], ["submit"], ["run", "--dry-run"]])
def test_fits_is_asked_before_every_render(command: list[str], tmp_path: Path) -> None:
    refused = torchjob(*command, "--to", "torchx:slurm", str(DEFAULT), "--set", "env.X=a,b",
                       cwd=tmp_path)
    assert refused.returncode == 2 and "env.X" in refused.stderr and "','" in refused.stderr, \
        refused
    assert not (tmp_path / "runs").exists()
    spec = tmp_path / "job.yaml"
    spec.write_text(DEFAULT.read_text() + "env: {X: 'a,b'}\n")
    told = torchjob("validate", "--to", "torchx:slurm", str(spec), cwd=tmp_path)
    assert told.returncode == 2 and "env.X" in told.stderr, told


# torchrun's words for processes per node: each node counts its own, so a backend whose
# nodes get only the GPUs the job asks for refuses ``gpu`` without ``resources.gpus``
ASKS_FOR_GPUS = {"docker", "slurm", "slurm:sbatch", "k8s", "k8s:trainjob"}


@pytest.mark.parametrize("name", RENDERABLE)
def test_one_process_per_gpu_needs_the_gpus_where_a_scheduler_gives_them(name: str) -> None:
    backend = registry.get(name)
    spec = load(DEFAULT, ["nproc_per_node=gpu", "k8s.pvc=claim"])
    if name in ASKS_FOR_GPUS:
        with pytest.raises(SpecError, match=r"nproc_per_node: 'gpu' starts one process per "
                           r"GPU, but the job asks .* for no GPU \(resources.gpus: 0\)"):
            backend.fits(spec)
    else:  # the node is this machine: its agent counts the GPUs torch sees
        backend.fits(spec)
    for word, gpus in (("gpu", 2), ("auto", 2), ("auto", 0), ("cpu", 0)):
        spec = load(DEFAULT, [f"nproc_per_node={word}", f"resources.gpus={gpus}",
                              "k8s.pvc=claim"])
        backend.fits(spec)
        text = backend.render(spec, Context(workdir="/w", run_id="r-1", port=29400)).text
        assert re.search(rf"--nproc-per-node[\s'\"=-]*{word}\b", text), (name, text)
        if name.startswith("k8s") and gpus:
            assert "nvidia.com/gpu: '2'" in text, text
        # every node that asks its scheduler or engine for GPUs checks it got them (local: the
        # node is this machine, resources.gpus asks nothing of it)
        expects = re.search(r"--expect-gpus[\s'\"=-]*2\b", text)
        assert bool(expects) == (bool(gpus) and name != "local"), (name, text)


def test_an_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(BackendError, match="unknown backend 'mars'; choose from docker, k8s, "
                                           "local, slurm, torchx"):
        registry.get("mars")


def test_validate_goes_through_the_registry(tmp_path: Path) -> None:
    """``validate`` asks the backend (the CLI imports none); one without a validator says what
    to use instead, exit 2."""
    manifest = ROOT / "k8s" / "manifests" / "pytorchjob-default.yaml"
    assert registry.get("k8s:trainjob").validate(manifest.read_text()) == []
    proc = torchjob("validate", "--to", "slurm", str(manifest))
    assert proc.returncode == 2 and proc.stderr == (
        "torchjob: backend 'slurm' has no validator of hand-written files: torchjob render "
        "--to slurm JOB.yaml checks a job spec\n"), proc.stderr


@pytest.mark.parametrize("text, backend, ident", [
    ("slurm:1234", "slurm", "1234"),
    ("slurm:1234_7", "slurm", "1234_7"),
    ("k8s:team/digits", "k8s", "team/digits"),
    ("k8s:digits", "k8s", "default/digits"),
    ("k8s:trainjob:team/digits", "k8s:trainjob", "team/digits"),
    ("torchx:local_cwd://torchjob/digits-1a2b", "torchx", "local_cwd://torchjob/digits-1a2b"),
    ("torchx:slurm://torchjob/77", "torchx", "slurm://torchjob/77"),
])
def test_handles_name_their_backend(text: str, backend: str, ident: str) -> None:
    found, handle = registry.parse_handle(text)
    assert handle == Handle(backend, ident) and str(handle) == f"{backend}:{ident}"
    assert found.name == backend
    assert registry.parse_handle(str(handle))[1] == handle  # printed handles parse back


def mask(text: str) -> str:
    """TorchX's dryrun names the app with a random suffix (its own ``torchx run --dryrun``
    does too); the rest of the request is fixed."""
    return re.sub(r"digits-[a-z0-9]{10,}", "digits-ID", text)


@pytest.mark.parametrize("name", RENDERABLE)
def test_render_is_deterministic_and_dry_run_prints_it(name: str, tmp_path: Path) -> None:
    spec = load(DEFAULT)
    context = Context(run_id="digits", python="python", workdir="/srv/job", port=29400,
                      cpu_count=2)
    first = registry.get(name).render(spec, context)
    again = registry.get(name).render(spec, context)
    assert first.text and mask(first.text) == mask(again.text)
    assert first.backend == name and first.name == "digits"
    rendered = torchjob("render", "--to", name, str(DEFAULT), cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    if name not in ("local", "docker"):  # run owns --dry-run for those two
        dry = torchjob("submit", "--to", name, "--dry-run", str(DEFAULT), cwd=tmp_path)
        assert dry.returncode == 0, dry.stderr
        if name.startswith(("k8s", "torchx")):  # no run id or port in the request
            assert mask(dry.stdout) == mask(rendered.stdout)


def test_k8s_submit_sends_exactly_the_rendered_objects(tmp_path: Path) -> None:
    """Against the API EMULATOR: the objects the client created are the rendered manifest."""
    with Emulator() as emulator:
        config = {"KUBECONFIG": emulator.kubeconfig(tmp_path / "kubeconfig")}
        for to, plural in (("k8s", "pytorchjobs"), ("k8s:trainjob", "trainjobs")):
            env = {**os.environ, **config}
            rendered = torchjob("render", "--to", to, str(DEFAULT), env=env)
            submitted = torchjob("submit", "--to", to, str(DEFAULT), env=env)
            assert submitted.returncode == 0, submitted.stderr
            assert submitted.stdout.strip() == f"{to}:default/digits"
            created = emulator.objects[(plural, "default", "digits")]
            created["metadata"].pop("uid")  # the one field the API server adds
            assert created == yaml.safe_load(rendered.stdout)
        # an elastic PyTorchJob: the job, then its rendezvous store's Deployment and Service,
        # each as rendered but for the ownerReference to the job that submit adds
        elastic = DEFAULT.parent / "elastic.yaml"
        rendered = torchjob("render", "--to", "k8s", str(elastic), env={**os.environ, **config})
        env = {**os.environ, **config}
        assert torchjob("submit", "--to", "k8s", str(elastic), env=env).returncode == 0
        created = [emulator.objects[key] for key in (
            ("pytorchjobs", "default", "digits-elastic"),
            ("deployments", "default", "digits-elastic-rdzv"),
            ("services", "default", "digits-elastic-rdzv"))]
        uid = created[0]["metadata"]["uid"]
        for obj in created:
            obj["metadata"].pop("uid")
        for obj in created[1:]:
            assert [o["uid"] for o in obj["metadata"].pop("ownerReferences")] == [uid]
        assert created == list(yaml.safe_load_all(rendered.stdout))


def test_a_sweep_is_a_set_of_jobs_where_there_are_no_job_arrays(tmp_path: Path) -> None:
    """On the API EMULATOR: one PyTorchJob per point, each with its own name, trainer
    arguments and run directory."""
    with Emulator() as emulator:
        config = {"KUBECONFIG": emulator.kubeconfig(tmp_path / "kubeconfig")}
        submitted = torchjob("submit", "--to", "k8s", str(DEFAULT), "--sweep", "lr=1e-3,3e-3",
                             "--sweep", "epochs=2", env={**os.environ, **config})
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.split() == ["k8s:default/digits-0", "k8s:default/digits-1"]
        for index, lr, text in ((0, "0.001", "1e-3"), (1, "0.003", "3e-3")):
            obj = emulator.objects[("pytorchjobs", "default", f"digits-{index}")]
            command = obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
                "containers"][0]["command"]
            assert command[command.index("--lr") + 1] == lr
            assert command[command.index("--epochs") + 1] == "2"
            assert command[command.index("--run-dir") + 1] == f"runs/digits/lr={text},epochs=2"


@pytest.mark.parametrize("name", ["slurm:sbatch", "torchx:slurm"])
def test_slurm_jobs_meet_on_their_job_ids_port_unless_the_spec_names_one(name: str,
                                                                         tmp_path: Path) -> None:
    """On Slurm the rendezvous port is the job's own (12000 + id % 20000), so that two jobs
    whose first node is one host do not meet on one port, and never one a local run picks;
    TorchX's keeps a port the spec gives (--to slurm: always the job's), as the script on a
    node works it out (tests/jobs/arrival.py: job 77)."""
    def endpoint(*sets: str) -> str:
        spec = load(DEFAULT, overrides=["nnodes=2", *sets])
        context = Context(run_id="x", python="python", workdir=str(tmp_path))
        argv, _ = arrival(registry.get(name).render(spec, context), tmp_path)
        return argv[argv.index("--rdzv-endpoint") + 1]
    assert endpoint() == f"h:{slurm_port(77)}"
    assert endpoint("rdzv.port=1234") == ("h:1234" if name == "torchx:slurm"
                                          else f"h:{slurm_port(77)}")

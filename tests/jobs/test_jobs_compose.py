"""The compose renderer (``torchjob render --to docker``): whole-document golden files, the
root compose.yaml kept in step, quoting of hostile values, and the engine lookup.

Regenerate the golden files after an intended change, and review the diff:

    TORCHJOB_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/jobs/test_jobs_compose.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from torchjob.jobs.command import agent_command
from torchjob.jobs.backends.docker.render import (RESTARTS, compose_text, escape, render_compose,
                                                  run_mounts)
from torchjob.jobs.backends.docker import containers
from torchjob.jobs.backends.docker.engine import find_engine
from torchjob.jobs.launcher import Stops
from torchjob.jobs.load import load, loads
from torchjob.jobs.values import SpecError, UserError
from tests.golden import assert_golden
from tests.procs import ROOT, env_for_tests, torchjob

HERE = Path(__file__).resolve().parent
EXAMPLES = ROOT / "jobs" / "examples"
ROOT_EXAMPLE = "jobs/examples/elastic.yaml"  # what the repository's compose.yaml is made from
HOSTILE = ["a'; touch /tmp/x", 'b"; echo "', "$(id)", "`id`", "${HOME}", "$HOME", "$$", "50%",
           "two words", "new\nline", "tab\there", "caf\u00e9 \u65e5\u672c \U0001f600", "",
           "yes", "null", "1e3", "0x10", "~", "- dash", "key: value", "# hash", "{a: b}",
           "[1]", "*ref", "&anchor", "!tag", "back\\slash", "trailing ", " leading"]


def unescape(value: object) -> object:
    """What compose's interpolation makes of a rendered value (only ``$$`` occurs)."""
    if isinstance(value, str):
        return value.replace("$$", "$")
    if isinstance(value, dict):
        return {k: unescape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unescape(v) for v in value]
    return value


@pytest.mark.parametrize("name, job, sets", [
    ("compose_elastic.yaml", "elastic.yaml", []),
    ("compose_default_2x2.yaml", "default.yaml",
     ["nnodes=2", "resources.cpu=2", "resources.memory=3Gi", "resources.shm=256Mi",
      "docker.restart=no", "env.NCCL_DEBUG=WARN"]),
])
def test_golden(name: str, job: str, sets: list[str]) -> None:
    args = [a for s in sets for a in ("--set", s)]
    result = torchjob("render", "--to", "docker", f"jobs/examples/{job}", *args,
                      env=env_for_tests())
    assert result.returncode == 0, result.stderr
    assert_golden(result.stdout, HERE / "golden" / name)


def test_root_compose_yaml_is_the_rendered_example() -> None:
    """compose.yaml at the top of the repository is rendered, never edited: regenerate with
    ``torchjob render --to docker jobs/examples/elastic.yaml > compose.yaml``."""
    result = torchjob("render", "--to", "docker", ROOT_EXAMPLE, env=env_for_tests())
    assert result.returncode == 0, result.stderr
    assert (ROOT / "compose.yaml").read_text() == result.stdout, \
        f"compose.yaml drifted: torchjob render --to docker {ROOT_EXAMPLE} > compose.yaml"


def test_one_service_per_node_running_the_one_agent_command() -> None:
    spec = load(EXAMPLES / "elastic.yaml")
    doc = render_compose(spec)
    # nnodes MAX, spares included, and the elastic job's own rendezvous store, which no
    # node hosts: the nodes depend on it and all are its clients
    assert list(doc["services"]) == ["rendezvous", "node0", "node1"]
    store = doc["services"].pop("rendezvous")
    assert store["command"] == ["python", "-m", "torchjob.trainer.store", "--port", "29400"]
    assert "volumes" not in store and "deploy" not in store and store["restart"] == "no"
    # the rendezvous id: each torchjob run's own project name, else the job's name
    want = list(agent_command(spec, python="python", rdzv_endpoint="rendezvous:29400",
                              run_id="${TORCHJOB_RUN_ID:-digits-elastic}", store_client=True))
    assert "join_timeout=600,last_call_timeout=5,is_host=false" in want
    for i, (name, service) in enumerate(doc["services"].items()):
        assert service["command"] == want
        assert service["hostname"] == name
        assert service["image"] == spec.image
        assert service["shm_size"] == "1024m"  # resources.shm (1Gi), in whole MiB
        assert service["restart"] == "no"  # the launcher restarts a killed node, not compose
        assert service.get("depends_on") == ["rendezvous"]
        assert service["volumes"] == [{"type": "bind", "source": "${TORCHJOB_HOST_DIR:-.}/runs",
                                       "target": "/workspace/runs"}]
    assert "--nnodes" in want and want[want.index("--nnodes") + 1] == "1:2"
    assert want[want.index("--rdzv-backend") + 1] == "c10d"
    fixed = render_compose(load(EXAMPLES / "default.yaml", ["nnodes=2"]))  # node0 hosts it
    assert list(fixed["services"]) == ["node0", "node1"]
    assert fixed["services"]["node1"]["depends_on"] == ["node0"]


def test_output_is_deterministic_and_parses_back() -> None:
    spec = load(EXAMPLES / "default.yaml", ["nnodes=3"])
    text = compose_text(render_compose(spec, host_dir="/srv/job"))
    assert text == compose_text(render_compose(spec, host_dir="/srv/job"))
    doc = yaml.safe_load(text)
    assert doc == render_compose(spec, host_dir="/srv/job")
    assert "&id" not in text and "*id" not in text  # no YAML anchors: each service is whole
    assert doc["services"]["node2"]["volumes"][0]["source"] == "/srv/job/runs"


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_env_and_args_survive_yaml_and_interpolation(value: str) -> None:
    spec = loads(yaml.safe_dump({"name": "job", "nnodes": 2, "env": {"WEIRD": value},
                                 "trainer": {"module": "mypkg.train", "args": {"note": value}}},
                                default_style='"'))
    doc = yaml.safe_load(compose_text(render_compose(spec)))
    for service in doc["services"].values():
        env = unescape(service["environment"])
        assert isinstance(env, dict) and env["WEIRD"] == value
        command = unescape(service["command"])
        assert isinstance(command, list) and command[-2:] == ["--note", value]


def test_secrets_are_passed_by_name_never_by_value() -> None:
    spec = loads("name: job\nsecrets: [{env: WANDB_API_KEY, secret: wandb, key: api-key}]\n"
                 "env: {A: b}")
    text = compose_text(render_compose(spec))
    env = yaml.safe_load(text)["services"]["node0"]["environment"]
    assert env["WANDB_API_KEY"] is None and env["A"] == "b"  # NAME with no value: pass-through
    assert "wandb" not in text and "api-key" not in text


@pytest.mark.parametrize("value", ["1e3", "0o17", "1_000", ".5e1", "1.5", "10", ".inf", "0x1F",
                                   "true", "no", "null", "~", "2026-01-01"])
def test_strings_that_look_like_numbers_are_quoted(value: str) -> None:
    """PyYAML (YAML 1.1) leaves 1e3 plain; docker compose (YAML 1.2) would read a number."""
    text = compose_text({"environment": {"A": value}})
    assert text in (f"environment:\n  A: '{value}'\n", f'environment:\n  A: "{value}"\n')


def test_escape_doubles_every_dollar() -> None:
    assert escape({"a": ["$x", "${y}", "$$"], "b": None}) == \
        {"a": ["$$x", "$${y}", "$$$$"], "b": None}


@pytest.mark.parametrize("text, want", [
    ("", ("exit-code", 3)), ("docker: {restart: 'no'}", ("no", 0)), ("max_restarts: 0", ("no", 0)),
    ("max_restarts: 7", ("exit-code", 7))])
def test_restarts_are_in_the_compose_file(text: str, want: tuple[str, int]) -> None:
    """Compose restarts on any exit but 0, so every service says ``restart: no``; what the
    launcher does instead is in the file, under x-torchjob, for it to read."""
    doc = yaml.safe_load(compose_text(render_compose(loads(f"name: job\n{text}"))))
    assert doc[RESTARTS] == {"restart": want[0], "max_restarts": want[1]}
    assert {service["restart"] for service in doc["services"].values()} == {"no"}


@pytest.mark.parametrize("extra, want", [
    ("", [("./runs", "/workspace/runs")]),
    ("run_dir: out/a\ncheckpoint_dir: ckpt/b", [("./ckpt", "/workspace/ckpt"),
                                                ("./out", "/workspace/out")]),
    ("run_dir: /scratch/run", [("/scratch/run", "/scratch/run")]),
    ("run_dir: /scratch/run\ncheckpoint_dir: /fast/ckpt",
     [("/fast/ckpt", "/fast/ckpt"), ("/scratch/run", "/scratch/run")]),
    ("run_dir: /data/run\nmounts: [{source: vol, target: /data}]", []),
    ("run_dir: .", [(".", "/workspace")]),
    # a user's script: the working directory is mounted, and holds the relative run dirs
    ("trainer: {script: train.py}", [(".", "/workspace")]),
    ("trainer: {module: mypkg.train}\nrun_dir: /scratch/run",
     [("/scratch/run", "/scratch/run"), (".", "/workspace")]),
    ("trainer: {script: /opt/train.py}\ndocker: {mount_workdir: false}",
     [("./runs", "/workspace/runs")]),
    ("docker: {mount_workdir: true}", [(".", "/workspace")]),
])
def test_run_mounts(extra: str, want: list[tuple[str, str]]) -> None:
    mounts = run_mounts(loads(f"name: job\n{extra}"), ".")
    assert [(m["source"], m["target"]) for m in mounts] == want


def test_spec_mounts_bind_paths_and_name_volumes() -> None:
    spec = loads("name: job\nmounts: [{source: /data, target: /data, read_only: true},\n"
                 "  {source: ./cache, target: /cache}, {source: datasets, target: /ds}]")
    doc = render_compose(spec, host_dir="/home/u")
    vols = doc["services"]["node0"]["volumes"]
    assert vols[1:] == [
        {"type": "bind", "source": "/data", "target": "/data", "read_only": True},
        {"type": "bind", "source": "/home/u/cache", "target": "/cache", "read_only": False},
        {"type": "volume", "source": "datasets", "target": "/ds", "read_only": False}]
    assert doc["volumes"] == {"datasets": {"name": "datasets"}}


def test_limits_from_resources() -> None:
    spec = loads("name: job\nnproc_per_node: 2\nresources: {cpu: 4, memory: 1.5Gi}")
    service = render_compose(spec)["services"]["node0"]
    assert service["deploy"] == {"resources": {"limits": {"cpus": "4", "memory": "1536M"}}}
    assert service["environment"]["OMP_NUM_THREADS"] == "2"  # 4 CPUs / 2 processes


def test_gpus_are_reserved_the_compose_way() -> None:
    service = render_compose(loads("name: job\nnproc_per_node: 2\nresources: {gpus: 2}"))["services"]["node0"]
    assert service["deploy"] == {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "count": 2, "capabilities": ["gpu"]}]}}}


@pytest.mark.parametrize("text, fragments", [
    ("run_dir: ../up", ["run_dir", "leaves the container's working directory"]),
])
def test_bad_specs_for_docker(text: str, fragments: list[str]) -> None:
    with pytest.raises(SpecError) as exc:
        render_compose(loads(f"name: job\n{text}"))
    assert all(f in str(exc.value) for f in fragments), str(exc.value)


@pytest.mark.parametrize("choice, found, want", [
    ("auto", {"podman", "podman-compose", "docker"}, "podman"),
    ("podman", {"podman", "podman-compose"}, "podman"),
])
def test_find_engine(choice: str, found: set[str], want: str) -> None:
    engine = find_engine(choice, which=lambda name: f"/usr/bin/{name}" if name in found else None)
    assert engine.name == want and engine.compose == ("podman-compose",)


@pytest.mark.parametrize("choice, found, fragment", [
    ("auto", set(), "no container engine with compose found"),
    ("podman", {"podman"}, "podman and podman-compose are not both on PATH"),
    ("podman", {"docker"}, "podman and podman-compose"),
])
def test_no_engine_is_a_user_error_that_says_how_to_install(choice: str, found: set[str],
                                                            fragment: str) -> None:
    with pytest.raises(UserError) as exc:
        find_engine(choice, which=lambda name: f"/x/{name}" if name in found else None)
    assert fragment in str(exc.value) and "apt-get install podman podman-compose" in \
        str(exc.value)


def test_run_without_an_engine_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    result = torchjob("run", "--to", "docker", str(EXAMPLES / "default.yaml"), cwd=tmp_path,
                      env=env_for_tests(PATH=str(empty)))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("torchjob: no container engine with compose found: "
                                    "install podman and podman-compose"), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing created, nothing started


def test_run_dry_run_prints_the_compose_file_that_render_prints(tmp_path: Path) -> None:
    """The file a run uses is the rendered one: relative host paths start at
    $TORCHJOB_HOST_DIR, which the run sets to the directory it was started in."""
    args = [str(EXAMPLES / "default.yaml"), "--set", "nnodes=2"]
    result = torchjob("run", "--to", "docker", "--dry-run", *args, cwd=tmp_path,
                      env=env_for_tests())
    assert result.returncode == 0, result.stderr
    assert result.stdout == torchjob("render", "--to", "docker", *args, cwd=tmp_path,
                                     env=env_for_tests()).stdout
    doc = yaml.safe_load(result.stdout)
    assert list(doc["services"]) == ["node0", "node1"]
    assert doc["services"]["node1"]["volumes"][0]["source"] == "${TORCHJOB_HOST_DIR:-.}/runs"
    assert not (tmp_path / "runs").exists()


def test_cli_docker_python_is_the_image_python() -> None:
    """The services run the image's ``python``, never the host's interpreter path."""
    result = torchjob("render", "--to", "docker", str(EXAMPLES / "default.yaml"),
                      env=env_for_tests())
    assert result.returncode == 0 and sys.executable not in result.stdout


def test_a_node_that_failed_for_good_ends_the_job_after_the_grace(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """node1 ended 2 (its checkpoints refused), node0 runs on (a worker hung in its teardown,
    seen once in the conformance matrix): after the grace node0 is stopped, never started
    again, and the run ends 2 instead of waiting for it for ever."""
    state = {"c0": "running 0", "c1": "exited 2"}
    calls: list[list[str]] = []

    def engine(argv: list[str], timeout: float = 600,
               **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if argv[1] == "inspect":
            return subprocess.CompletedProcess(argv, 0, "\n".join(state[c] for c in argv[4:]),
                                               "")
        if argv[1] == "stop":
            state.update({c: "exited 143" for c in argv[4:] if state[c].startswith("running")})
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(containers, "_run", engine)
    monkeypatch.setattr(containers, "FINISH_GRACE_S", 0.0)
    monkeypatch.setattr(containers, "_POLL_S", 0.0)
    spec = loads("name: job\nnnodes: 2\nmax_restarts: 3\ntrainer: {module: x}")
    run = containers._Run(containers.Engine("podman", ("podman-compose",)), "job-1", Path("compose.yaml"),
                      3, Stops())
    run.nodes = [containers._Node("node0", "c0"), containers._Node("node1", "c1")]
    containers._wait(run, spec, 30.0, sys.stderr)
    assert [c[1] for c in calls if c[1] != "inspect"] == ["stop"], calls
    assert containers.result(spec, run.nodes, False) == 2
    assert "node1 failed (exit 2): the job failed; stopping the node(s) still running" \
        in capsys.readouterr().err




def test_containers_run_as_the_invoking_user_unless_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: the node containers run as the caller (a 700 home directory is readable in
    them, what they write is the caller's): under rootless podman as the container's root,
    which is the caller on the host (podman-compose 1.0 drops ``userns_mode``, so keep-id
    never reached podman, and uid 1234 in the container was a sub-uid on the host); under
    Docker's daemon as the caller's ids. Root keeps the image's user, uid 1000. (Rendered
    here; tests/containers/test_nonroot.py runs them as a user who is not root.)"""
    from torchjob.jobs.backends.docker import backend as docker_backend
    from torchjob.jobs import images
    spec = load(EXAMPLES / "default.yaml")
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    monkeypatch.setattr(os, "getgid", lambda: 567)
    monkeypatch.setattr(docker_backend.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert docker_backend.invoking_user(spec) == "0:0"
    doc = render_compose(spec, user="0:0")
    nodes = [s for name, s in doc["services"].items() if name.startswith("node")]
    assert nodes and all(s["user"] == "0:0" and "userns_mode" not in s for s in nodes)
    docker = load(EXAMPLES / "default.yaml", ["docker.engine=docker"])
    for said, user in (("[\"name=seccomp,profile=builtin\"]", "1234:567"),
                       ("[\"name=seccomp,profile=builtin\",\"name=rootless\"]", "0:0")):
        monkeypatch.setattr(images, "run_captured", lambda argv, **_: subprocess.CompletedProcess(
            argv, 0, said + "\n", ""))
        assert docker_backend.invoking_user(docker) == user
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert docker_backend.invoking_user(spec) is None
    assert "user" not in render_compose(spec)["services"]["node0"]

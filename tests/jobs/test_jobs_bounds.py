"""Each input limit, by example: a bad input exits 2 within seconds, in one line that names
the field, the value (shortened when huge) and the fix; and the escapes that let a user's
``$`` reach TorchX, compose and Kubernetes unchanged."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest
import yaml
from torchx import specs

from torchjob.jobs.backends.docker.render import render_compose
from torchjob.jobs.backends.torchx.render import render_appdef
from torchjob.jobs.hosts import MAX_HOST_NODES, system_dir
from torchjob.jobs.load import MAX_SPEC_BYTES, loads
from torchjob.jobs.checks import MAX_NPROC_PER_NODE
from torchjob.jobs.values import MAX_NNODES, MAX_TOTAL_BYTES, MAX_VALUE_BYTES, SpecError
from torchjob.k8s.pytorchjob import render_pytorchjob
from tests.jobs.arrival import interpolate
from tests.jobs.test_jobs_hostile import cli, time_limit
from tests.k8s.kubelet import Everything, expand

USER = ["$app_id", "${app_id}", "$$", "$(HOME)", "${X}", "$", "a'; echo x"]


def refused(tmp_path: Path, spec: str | Path, *fragments: str, to: str = "local") -> str:
    """``torchjob render --to TO SPEC`` exits 2 within seconds with one line holding each
    fragment; that line."""
    if isinstance(spec, str):
        (tmp_path / "job.yaml").write_text(spec)
        spec = tmp_path / "job.yaml"
    start = time.monotonic()
    with time_limit(10):
        code, err = cli("render", "--to", to, str(spec))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert time.monotonic() - start < 5
    for fragment in fragments:
        assert fragment in err, err
    return err


# ---------------------------------------------------------------------------- the file

def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # no writer: opening it for reading would block forever
    refused(tmp_path, tmp_path / "fifo", "fifo: is not a regular file")


def test_dev_zero_is_refused_without_reading_it(tmp_path: Path) -> None:
    refused(tmp_path, Path("/dev/zero"), "/dev/zero: is not a regular file")


def test_a_2_mib_file_is_refused_by_its_size(tmp_path: Path) -> None:
    (tmp_path / "big.yaml").write_bytes(b"#" * (2 * MAX_SPEC_BYTES))
    refused(tmp_path, tmp_path / "big.yaml", f"is {2 * MAX_SPEC_BYTES} bytes, more than "
            f"{MAX_SPEC_BYTES} bytes (MAX_SPEC_BYTES)")


def test_a_directory_and_a_missing_file_say_so(tmp_path: Path) -> None:
    refused(tmp_path, tmp_path, "is a directory, not a job spec file")
    refused(tmp_path, tmp_path / "nope.yaml", "nope.yaml: no such file")


def test_an_alias_repeated_past_the_budget_is_refused() -> None:
    big = "x" * 4096
    text = f"name: x\nslurm: {{extra_flags: [&f '--{big}', {', '.join(['*f'] * 300)}]}}\n"
    with pytest.raises(SpecError, match="with its YAML aliases expanded"):
        loads(text)


# ------------------------------------------------------------------------------ sizes

def test_nnodes_999999_is_refused_by_name(tmp_path: Path) -> None:
    refused(tmp_path, "name: x\nnnodes: 999999\n", "nnodes: '999999' asks for more than "
            f"{MAX_NNODES} nodes", "MAX_NNODES")


@pytest.mark.parametrize("raw", ["1000000", "99999999", "1:99999999", "9" * 19, "1:" + "9" * 40])
def test_a_node_count_of_any_length_is_refused_by_name(raw: str) -> None:
    """Not 'is not a node count' from 7 digits on; past 18 digits int() never reads it."""
    with pytest.raises(SpecError, match=f"^--set: nnodes: '?{raw}'? asks for more than "
                       f"{MAX_NNODES} nodes, .*MAX_NNODES.*write a smaller count$"):
        loads("name: x", [f"nnodes={raw}"])
    assert str(loads("name: x", ["nnodes=1:" + "0" * 30 + "2"]).nnodes) == "1:2"


def test_nproc_per_node_is_bounded(tmp_path: Path) -> None:
    refused(tmp_path, f"name: x\nnproc_per_node: {MAX_NPROC_PER_NODE + 1}\n",
            "nproc_per_node:", "MAX_NPROC_PER_NODE")


@pytest.mark.parametrize("to", ["docker", "local", "torchx:local_cwd"])
def test_one_host_holds_at_most_max_host_nodes(tmp_path: Path, to: str) -> None:
    spec = f"name: x\nnnodes: {MAX_HOST_NODES + 1}\nk8s: {{pvc: runs}}\n"
    refused(tmp_path, spec, f"nnodes: {MAX_HOST_NODES + 1} nodes on one host", "MAX_HOST_NODES",
            "--to slurm", to=to)
    with time_limit(10):  # a cluster takes it
        assert cli("render", "--to", "k8s", str(tmp_path / "job.yaml"))[0] == 0


def test_torchx_kubernetes_is_held_to_one_storable_object(tmp_path: Path) -> None:
    (tmp_path / ".torchxconfig").write_text("[kubernetes]\nqueue = default\n")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        refused(tmp_path, "name: x\nnnodes: 4096\n", "MAX_TORCHX_POD_NODES", "--to k8s",
                to="torchx:kubernetes")
    finally:
        os.chdir(here)


def test_env_with_a_nul_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, 'name: x\nenv: {A: "a\\0b"}\n', "env.A:", "contains a NUL character")


def test_env_of_200_kb_is_refused_and_shown_short(tmp_path: Path) -> None:
    err = refused(tmp_path, f"name: x\nenv: {{A: {'v' * 200_000}}}\n", "env.A:",
                  f"more than {MAX_VALUE_BYTES} bytes")
    assert len(err) < 400


def test_env_in_total_is_bounded() -> None:
    values = {f"V{i}": "v" * (MAX_VALUE_BYTES - 10) for i in range(3)}
    with pytest.raises(SpecError, match=f"more than {MAX_TOTAL_BYTES} bytes"):
        loads(yaml.safe_dump({"name": "x", "env": values}))


def test_trainer_words_and_paths_are_bounded() -> None:
    with pytest.raises(SpecError, match=r"trainer.args\[0\].*MAX_VALUE_BYTES"):
        loads(yaml.safe_dump({"name": "x", "trainer": {"module": "m",
                                                        "args": ["w" * 40_000]}}))
    with pytest.raises(SpecError, match=r"run_dir.*PATH_MAX"):
        loads(yaml.safe_dump({"name": "x", "run_dir": "d" * 5000}))
    with pytest.raises(SpecError, match=r"trainer.script.*without control characters"):
        loads(yaml.safe_dump({"name": "x", "trainer": {"script": "a\0.py"}}))


# ------------------------------------------------------------------ system directories

@pytest.mark.parametrize("path", ["/etc", "/etc/", "//etc", "/usr/../etc", "/", "/lib64",
                                  "/var/", "/root"])
def test_system_directories_are_found_however_spelled(path: str) -> None:
    assert system_dir(path) is not None
    assert system_dir("/etc/app") is None and system_dir("/data") is None


EVERY_BACKEND = ["local", "docker", "slurm", "slurm:sbatch", "torchx", "torchx:local_cwd",
                 "torchx:kubernetes", "k8s", "k8s:trainjob"]


@pytest.mark.parametrize("to", EVERY_BACKEND)
def test_a_system_run_or_checkpoint_dir_is_refused_by_every_backend(tmp_path: Path,
                                                                    to: str) -> None:
    (tmp_path / ".torchxconfig").write_text("[kubernetes]\nqueue = default\n")
    for field in ("run_dir", "checkpoint_dir"):
        refused(tmp_path, f"name: x\n{field}: /usr/../etc\n", f"{field}: '/usr/../etc' is the "
                "system directory /etc", to=to)


@pytest.mark.parametrize("to", ["local", "docker", "slurm", "torchx:local_cwd"])
def test_a_relative_run_dir_is_resolved_where_the_job_starts(tmp_path: Path, to: str) -> None:
    """The backends whose nodes write where torchjob runs: ../../.. from a folder is /."""
    from tests.jobs.test_jobs_cli import torchjob
    depth = len(tmp_path.parts) - 1
    (tmp_path / "job.yaml").write_text(f"name: x\nrun_dir: {'../' * depth}etc\n")
    result = torchjob("render", "--to", to, "job.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "is the host's system directory /etc" in result.stderr, \
        result.stderr


@pytest.mark.parametrize("target", ["/etc", "/data/../usr", "//bin/", "/x/..", "/lib64"])
def test_a_mount_target_that_normalises_to_a_system_dir_is_refused(target: str) -> None:
    with pytest.raises(SpecError, match="mounts.0..target: .* is the container's system "
                                        "directory"):
        loads(yaml.safe_dump({"name": "x", "mounts": [{"source": "d", "target": target}]}))
    loads(yaml.safe_dump({"name": "x", "mounts": [{"source": "d", "target": "/data/etc"}]}))


def test_a_mount_source_reaching_a_system_dir_through_dots_is_refused(tmp_path: Path) -> None:
    depth = len(Path.cwd().parts) - 1
    spec = f"name: x\nmounts: [{{source: ./{'../' * depth}usr, target: /data}}]\n"
    for to in ("docker", "torchx:local_cwd"):
        refused(tmp_path, spec, "mounts[0].source", "system directory /usr", to=to)


def test_a_relative_run_dir_from_the_root_is_refused_for_docker() -> None:
    with pytest.raises(SpecError, match="run_dir: 'etc/x' is the host's system directory"):
        render_compose(loads("name: x\nrun_dir: etc/x"), workdir="/")


def test_mount_sources_are_refused_for_docker_slurm_containers_and_torchx(
        tmp_path: Path) -> None:
    spec = "name: x\nmounts: [{source: //etc/, target: /data}]\n"
    for to in ("docker", "torchx", "torchx:local_cwd"):
        refused(tmp_path, spec, "mounts[0].source: '//etc/' is the host's system directory",
                to=to)
    refused(tmp_path, spec + "slurm: {container: pyxis}\n", "mounts[0].source", to="slurm")
    refused(tmp_path, spec, "hostPath", to="k8s")  # Kubernetes refuses every host path


# --------------------------------------------------------------------------- escaping

def test_dollars_reach_torchx_unchanged() -> None:
    """Through TorchX's own macro substitution (``macros.Values.apply``), then bash's words."""
    spec = loads(yaml.safe_dump({"name": "x", "nnodes": 2, "env": {"A": "".join(USER)},
                                 "trainer": {"script": "t.py", "args": USER}}))
    role = render_appdef(spec).roles[0]
    role = specs.macros.Values(img_root="", app_id="APP", replica_id="0",
                               rank0_env="RANK0").apply(role)
    words = shlex.split(role.args[1])
    assert words[-len(USER):] == USER and role.env["A"] == "".join(USER)
    assert words[words.index("--rdzv-id") + 1] == "APP"  # torchjob's own macros still work
    assert "${RANK0:=localhost}:29400" in words


def test_torchx_slurm_refuses_what_its_scheduler_would_replace(tmp_path: Path) -> None:
    refused(tmp_path, "name: x\nenv: {A: '${app_id}'}\n", "env.A:", "job id",
            to="torchx:slurm")
    refused(tmp_path, "name: x\nenv: {A: 'a,b'}\n", "env.A:", "splits at commas",
            to="torchx:slurm")


def test_dollar_paren_reaches_kubernetes_unchanged() -> None:
    """The kubelet's $(VAR) expansion is EMULATED (tests/k8s/kubelet.py)."""
    spec = loads(yaml.safe_dump({"name": "x", "env": {"A": "$(HOME)", "HOME": "/h"},
                                 "trainer": {"script": "t.py", "args": USER}}))
    container = render_pytorchjob(spec)["spec"]["pytorchReplicaSpecs"]["Master"][
        "template"]["spec"]["containers"][0]
    defined = Everything()
    assert [expand(w, defined) for w in container["command"][-len(USER):]] == USER
    [value] = [e["value"] for e in container["env"] if e["name"] == "A"]
    assert expand(value, defined) == "$(HOME)"


def test_braces_reach_compose_unchanged() -> None:
    """Compose's interpolation is EMULATED (tests/jobs/arrival.py); the renderer's own
    ``${TORCHJOB_HOST_DIR:-.}`` still reaches compose as a variable."""
    spec = loads(yaml.safe_dump({"name": "x", "env": {"A": "${X}"},
                                 "trainer": {"script": "t.py", "args": USER}}))
    service = yaml.safe_load(yaml.safe_dump(render_compose(spec)))["services"]["node0"]
    assert [interpolate(w) for w in service["command"][-len(USER):]] == USER
    assert interpolate(service["environment"]["A"]) == "${X}"
    assert [interpolate(v["source"]) for v in service["volumes"]] == ["."]

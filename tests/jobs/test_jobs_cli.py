"""The torchjob command line, run as users run it: a subprocess, exit codes, stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import TORCHJOB, env_for_tests, torchjob

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"


def assert_user_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr  # one line
    for fragment in fragments:
        assert fragment in result.stderr


MALFORMED = {
    "nnodes": ('name: x\nnnodes: "3:2"\n', "nnodes: '3:2' is not a node range"),
    "unknown": ("name: x\nnprocs: 2\n", "did you mean"),
    "name": ("name: \"a'; rm -rf /\"\n", "is not a job name"),
    "type": ("name: x\nmax_restarts: two\n", "but an integer"),
    "trainer-arg": ("name: x\ntrainer: {args: {schedule: linear}}\n", "trainer.args.schedule"),
    "secret-value": ("name: x\nsecrets: [{env: T, secret: s, key: k, value: v}]\n",
                     "secretKeyRef"),
    "yaml": ("name: [x\n", "not valid YAML"),
    "not-mapping": ("- 1\n", "top level must be a mapping"),
    "recursive-alias": ("name: x\nenv: &e {A: *e}\n", "a YAML alias inside itself"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("command", [["run"], ["render"], ["submit", "--to", "slurm"],
                                     ["render", "--to", "torchx"]])
def test_malformed_spec_exits_2_with_one_line(tmp_path: Path, name: str,
                                              command: list[str]) -> None:
    """On every command, and it ends (a recursive alias once kept them busy for good). The
    deadline is 60 s, not 10: each takes about 1 s alone, but beside the matrix's eight columns
    on two cores one took over 10 s in CI (stop 53) after it had printed its line."""
    text, fragment = MALFORMED[name]
    (tmp_path / "job.yaml").write_text(text)
    result = torchjob(*command, "job.yaml", cwd=tmp_path, timeout=60)
    assert_user_error(result, "torchjob: job.yaml: ", fragment)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("to", ["local", "torchx:local_cwd"])
def test_unusable_run_and_checkpoint_dirs_stop_before_anything_starts(tmp_path: Path,
                                                                      to: str) -> None:
    """A file where a directory should be, or a directory nobody may write (immutable: root
    too), is refused with exit 2 before any process starts, not at the first save."""
    (tmp_path / "t.py").write_text("raise SystemExit('started')\n")
    (tmp_path / "afile").write_text("")
    for sets, fragment in ((["checkpoint_dir=afile"], "checkpoint_dir: 'afile': "),
                           (["run_dir=afile/run"], "(on its path) is a file, not a directory")):
        result = torchjob("run", "--to", to, *[w for s in sets for w in ("--set", s)], "t.py",
                          cwd=tmp_path, timeout=60)
        assert_user_error(result, fragment, "is a file, not a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    subprocess.run(["chattr", "+i", str(locked)], check=True)
    try:
        result = torchjob("run", "--to", to, "--set", "checkpoint_dir=locked/ck", "t.py",
                          cwd=tmp_path, timeout=60)
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert_user_error(result, "checkpoint_dir: 'locked/ck': ", "(on its path) cannot be written")


def test_render_examples() -> None:
    default = torchjob("render", "--to", "local", str(EXAMPLES / "default.yaml"), timeout=60)
    assert default.returncode == 0  # stderr: the job's timeouts (tests/jobs/test_timeouts.py)
    assert default.stderr.startswith("torchjob: the job's timeouts")
    (line,) = default.stdout.splitlines()
    assert "--nproc-per-node 2" in line and "-m torchjob.trainer" in line and "--epochs 12" in line
    assert line.startswith("OMP_NUM_THREADS=")
    assert f"{sys.executable} -m torchjob.trainer.agent" in line
    elastic = torchjob("render", str(EXAMPLES / "elastic.yaml"), timeout=60)
    lines = elastic.stdout.splitlines()
    # the rendezvous store first (its own process), the two agents, then the store stopped
    assert elastic.returncode == 0 and len(lines) == 4 and lines[-1] == "wait %2 %3; kill %1"
    assert "-m torchjob.trainer.store --port" in lines[0]
    assert all("--nnodes 1:2" in line and line.endswith(" &") for line in lines[1:3])


def test_set_overrides_reach_the_command() -> None:
    result = torchjob("render", str(EXAMPLES / "default.yaml"), "--set", "trainer.args.epochs=3",
                      "--set", "nnodes=1:2", "--set", "env.FOO=bar baz", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--epochs 3" in result.stdout and "--nnodes 1:2" in result.stdout
    assert "FOO='bar baz'" in result.stdout


def test_run_dry_run_prints_and_starts_nothing(tmp_path: Path) -> None:
    result = torchjob("run", "--dry-run", str(EXAMPLES / "default.yaml"), cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--rdzv-id digits-" in result.stdout and "--rdzv-endpoint 127.0.0.1:" in result.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, fragments", [
    (["run", "--to", "mars", "x.yaml"], ["unknown backend 'mars'", "docker, k8s, local"]),
    (["run", "--to", "slurm", "x.yaml"], ["x.yaml: no such file"]),
    (["render", "--to", "docker", "x.yaml"], ["x.yaml: no such file"]),
    (["run", "--to", "docker", "x.yaml"], ["x.yaml: no such file"]),
    (["run", "--to", "torchx:kube rnetes", str(EXAMPLES / "default.yaml")],
     ["not a TorchX scheduler name"]),
    (["status", "local:digits-000000"], ["no local run 'digits-000000' on this machine"]),
    (["cancel", "local:../x"], ["is not a run id"]),
    (["status", "--to", "docker", "1"], ["no docker run '1' on this machine"]),
    (["logs", "docker:123"], ["no docker run '123' on this machine"]),
    (["status", "1234"], ["does not say its backend", "slurm:1234"]),
    (["status", "mars:1234"], ["does not say its backend"]),
    (["status", "slurm:1a"], ["'1a' is not a Slurm job id", "slurm:NAME"]),
    (["cancel", "--to", "k8s:trainjob", "job"], ["no Kubernetes cluster configured"]),
    (["cancel", "k8s:trainjob:ns/job"], ["no Kubernetes cluster configured"]),
    (["status", "k8s:Bad_Name"], ["is not a job: write NAMESPACE/NAME"]),
    (["status", "torchx:nope"], ["is not a TorchX app handle"]),
    *[([command, "torchx:local_cwd://torchx/digits-1a2b"],
       ["TorchX knows no app", "only in the process that started them"])
      for command in ("status", "logs", "cancel")],  # TorchX's cancel alone: nothing, silently
    (["list", "--to", "torchx:local_cwd"], ["TorchX cannot list local_cwd apps"]),
    (["submit", "--to", "torchx:local_cwd", "--sweep", "lr", str(EXAMPLES / "default.yaml")],
     ["--sweep: 'lr' is not ARG=V1,V2"]),
    (["render", "--to", "k8s", "--sweep", "nope=1,2", str(EXAMPLES / "default.yaml")],
     ["sweep.nope: is not a trainer argument"]),
    (["submit", "x.yaml"], ["--to"]),
    (["run"], ["JOB.yaml"]),
    (["frobnicate"], ["invalid choice"]),
    ([], ["COMMAND"]),
    (["run", "missing.yaml"], ["missing.yaml: no such file"]),
    (["run", "."], ["is a directory"]),
    (["run", str(EXAMPLES / "default.yaml"), "--set", "epochs"], ["has no '='"]),
    (["run", str(EXAMPLES / "default.yaml"), "--set", "epochs=3"],
     ["--set: epochs: unknown key"]),
    (["run", "--grace", "soon", str(EXAMPLES / "default.yaml")], ["--grace"]),
])
def test_usage_errors(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    assert_user_error(torchjob(*args, cwd=tmp_path, timeout=60), *fragments)


@pytest.mark.parametrize("command", [[], ["run"], ["render"], ["submit"], ["status"], ["logs"],
                                     ["cancel"]])
def test_help(command: list[str]) -> None:
    result = torchjob(*command, "--help", timeout=60)
    assert result.returncode == 0 and "usage: torchjob" in result.stdout
    assert "--to" in result.stdout or not command


@pytest.mark.parametrize("command", [("run",), ("run", "--to", "docker"),
                                     ("submit", "--to", "slurm"), ("submit", "--to", "local")])
def test_missing_secret_exits_2_before_starting(tmp_path: Path, command: tuple[str, ...]) -> None:
    """Every backend whose nodes read secrets from this environment checks them once, in
    preflight, before anything else (no cluster or engine needed to be told)."""
    (tmp_path / "job.yaml").write_text("name: x\nsecrets: [{env: TORCHJOB_TEST_UNSET, "
                                       "secret: s, key: k}]\n")
    result = torchjob(*command, "job.yaml", cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("torchjob: secret variable(s) not set: TORCHJOB_TEST_UNSET")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()


# -- torchjob run [OPTIONS] SCRIPT.py [ARGS...]: no YAML needed, as torchrun takes it ----------

def rendered(*args: str, cwd: Path) -> str:
    result = torchjob("render", *args, cwd=cwd, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("to", ["local", "docker", "slurm", "torchx", "k8s"])
def test_a_script_and_its_args_without_yaml_on_every_backend(tmp_path: Path, to: str) -> None:
    """Everything after the script is the script's, also words that look like our options;
    the same job as the spec that says so, on every backend."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    words = ["3", "--set", "x=1", "--nproc-per-node", "9", "--to", "k8s"]
    (tmp_path / "job.yaml").write_text(
        "name: train\nnproc_per_node: 2\nnnodes: 1:2\nmax_restarts: 1\n"
        "k8s: {checkpoints: pod-local}\n"
        f"trainer: {{script: train.py, args: {words!r}}}\n")
    cli = rendered("--to", to, "--nproc-per-node", "2", "--nnodes", "1:2", "--max-restarts",
                   "1", "--set", "k8s.checkpoints=pod-local", "train.py", *words, cwd=tmp_path)
    spec = rendered("--to", to, "job.yaml", cwd=tmp_path)
    assert [line for line in cli.splitlines() if not line.startswith("#")] == \
        [line for line in spec.splitlines() if not line.startswith("#")]
    assert "train.py" in cli


def test_module_form_names_the_job_after_the_module(tmp_path: Path) -> None:
    out = rendered("--nproc_per_node=2", "-m", "mypkg.train_gpt", "--lr", "0.1", cwd=tmp_path)
    assert "--rdzv-id train-gpt " in out and out.rstrip().endswith("-m mypkg.train_gpt --lr 0.1")
    # torchrun's own -m torchjob.trainer: the built-in trainer, its arguments as words
    out = rendered("-m", "torchjob.trainer", "--epochs", "1", cwd=tmp_path)
    assert out.rstrip().endswith("-m torchjob.trainer --run-dir runs/trainer --checkpoint-dir "
                                 "runs/trainer/checkpoints --epochs 1")


def test_save_spec_writes_the_job_that_runs_again(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    first = rendered("--save-spec", "saved.yaml", "--nproc-per-node", "2", "--set",
                     "env.A=b", "train.py", "--lr", "0.1", cwd=tmp_path)
    assert rendered("saved.yaml", cwd=tmp_path) == first
    assert (tmp_path / "saved.yaml").read_text().startswith("# Written by torchjob render")
    # a spec file's overrides are saved with it
    rendered(str(EXAMPLES / "default.yaml"), "--set", "trainer.args.epochs=3", "--save-spec",
             "d.yaml", cwd=tmp_path)
    assert rendered("d.yaml", cwd=tmp_path) == rendered(
        str(EXAMPLES / "default.yaml"), "--set", "trainer.args.epochs=3", cwd=tmp_path)


@pytest.mark.parametrize("args, fragments", [
    (["run", "--nproc-per-node", "0", "t.py"], ["--nproc-per-node: nproc_per_node: 0"]),
    (["run", "--nnodes", "3:2", "t.py"], ["--nnodes: nnodes: '3:2'"]),
    (["run", "--name", "Bad_Name", "t.py"], ["is not a job name"]),
    (["run", str(EXAMPLES / "default.yaml"), "extra"], ["'extra' after", "SCRIPT.py [ARGS...]"]),
    (["run", "--save-spec", "/nonexistent/dir/s.yaml", "t.py"], ["--save-spec", "cannot write"]),
    (["run", "--save-spec", ".", "t.py"], ["--save-spec", "is a directory"]),
    (["run", "nowhere.py"], ["nowhere.py", "is not a file"]),
    (["run", "--nproc-per-node", "some", "t.py"], ["'some' is a string, but a process count",
                                                   "gpu, cpu, auto"]),
    # torchrun's own options, pasted: what each was for, and to drop it
    (["run", "--rdzv_backend=c10d", "--master-port", "1", "t.py"],
     ["--rdzv-backend, --master-port are torchrun's: each backend places the nodes",
      "drop them"]),
    (["run", "--log-dir", "d", "t.py"], ["--log-dir is torchrun's", "torchjob logs JOB --rank"]),
    # a program of another language: torchrun's --no-python, which torchjob does not take
    (["run", "--no-python", "t.sh"], ["--no-python is torchrun's: torchjob runs Python workers"]),
    (["run", "t.sh", "--x"], ["t.sh: a program for /bin/sh, not Python", "JOB.yaml",
                              "SCRIPT.py"]),
])
def test_command_line_job_errors(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    (tmp_path / "t.py").write_text("pass\n")
    (tmp_path / "t.sh").write_text("#!/bin/sh\nexec python3 t.py \"$@\"\n")
    assert_user_error(torchjob(*args, cwd=tmp_path, timeout=60), *fragments)
    assert not (tmp_path / "runs").exists()


def test_job_names_from_scripts() -> None:
    from torchjob.jobs.invocation import job_name
    assert [job_name(t) for t in ("train.py", "src/Train_GPT-2.py", "9lives.py", "_.py",
                                  "x" * 80 + ".py", "bin/train", "entraîner_ünï.py")] == \
        ["train", "train-gpt-2", "job-9lives", "job", "x" * 40, "train", "entrainer-uni"]
    assert job_name("a.b.c", module=True) == "c"


def test_validate_reads_job_specs_too(tmp_path: Path) -> None:
    """A job spec is loaded (and with --to rendered for that backend); a manifest still goes to
    the Kubernetes validator. Exit 2 when anything is wrong, each problem on stderr."""
    (tmp_path / "two.yaml").write_text("name: two\nnnodes: 2\n")
    (tmp_path / "bad.yaml").write_text("name: Bad\n")
    ok = torchjob("validate", str(EXAMPLES / "default.yaml"), "two.yaml", cwd=tmp_path, timeout=60)
    assert ok.returncode == 0 and ok.stdout.count("valid job spec") == 2, ok
    bad = torchjob("validate", "bad.yaml", cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "bad.yaml: name: 'Bad' is not a job name" in bad.stderr
    assert "kind" not in bad.stderr + bad.stdout  # never read as a manifest
    for_k8s = torchjob("validate", "--to", "k8s", "two.yaml", cwd=tmp_path, timeout=60)
    assert for_k8s.returncode == 2 and "two.yaml: k8s.pvc: is not set" in for_k8s.stderr
    assert torchjob("validate", "--to", "slurm", "two.yaml", cwd=tmp_path,
                    timeout=60).returncode == 0
    manifest = Path(__file__).resolve().parents[2] / "k8s" / "manifests" / "trainjob.yaml"
    both = torchjob("validate", str(manifest), "two.yaml", cwd=tmp_path, timeout=60)
    assert both.returncode == 0 and f"{manifest}: valid\n" in both.stdout, both
    (tmp_path / "bytes.yaml").write_bytes(bytes(range(128, 256)))  # not text
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")  # past the stack
    damaged = torchjob("validate", "bytes.yaml", "deep.yaml", cwd=tmp_path, timeout=60)
    assert damaged.returncode == 2 and "Traceback" not in damaged.stderr, damaged
    assert "bytes.yaml: is not UTF-8 text" in damaged.stderr, damaged
    deep = torchjob("validate", "deep.yaml", cwd=tmp_path, timeout=60)
    assert deep.returncode == 2 and "deep.yaml: <manifest>: it is nested too deeply" \
        in deep.stderr and "Traceback" not in deep.stderr, deep


def test_list_has_a_header_and_is_quiet_about_backends_not_set_up(tmp_path: Path) -> None:
    """No Kubernetes cluster, no TorchX scheduler named: not listed, without a word; with -v,
    why. An empty state directory: the header alone."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    quiet = torchjob("list", "--to", "local", env=env, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert quiet.stdout.split() == ["JOB", "STATE", "NAME", "AGE", "RUN", "DIR"]
    told = torchjob("list", "-v", env=env)
    assert told.returncode == 0 and "torchjob: k8s: not listed: " in told.stderr, told.stderr
    assert "torchjob: torchx: not listed: say which TorchX scheduler" in told.stderr


def test_ages_as_kubectl_shows_them() -> None:
    from torchjob.jobs.cli import age
    assert [age(1000 - s, 1000) for s in (5, 59, 60, 3599, 3600, 86400 * 3)] == \
        ["5s", "59s", "1m", "59m", "1h", "3d"]
    assert age(None, 0) == "-"


@pytest.mark.parametrize("to, package, extra", [("slurm", "submitit", "slurm"),
                                                ("torchx", "torchx", "torchx")])
def test_a_backend_whose_package_is_missing_names_its_extra(tmp_path: Path, to: str,
                                                            package: str, extra: str) -> None:
    """The backends' packages are extras (pip install 'torchjob[slurm]'): without one, that
    backend says what to install, exit 2, and the local backend still runs."""
    from tests.procs import with_sitecustomize
    blocked = f"import sys\nsys.modules[{package!r}] = None  # as if not installed\n"
    env = {**os.environ, "PYTHONPATH": with_sitecustomize(tmp_path / "site", blocked)}
    (tmp_path / "t.py").write_text("pass\n")
    proc = torchjob("render", "--to", to, "t.py", env=env, cwd=tmp_path, timeout=60)
    assert_user_error(proc, f"the {to} backend needs the Python package {package}, which is "
                      f"not installed here: pip install 'torchjob[{extra}]'")
    local = torchjob("render", "t.py", env=env, cwd=tmp_path, timeout=60)
    assert local.returncode == 0, local.stderr


def test_k8s_without_its_client_package_names_its_extra(tmp_path: Path) -> None:
    """Rendering needs no Kubernetes client; talking to a cluster does."""
    from tests.procs import with_sitecustomize
    env = {**os.environ, "PYTHONPATH": with_sitecustomize(
        tmp_path / "site", "import sys\nsys.modules['kubernetes'] = None\n")}
    rendered = torchjob("render", "--to", "k8s", str(EXAMPLES / "default.yaml"), env=env,
                        timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    status = torchjob("status", "k8s:default/x", env=env, timeout=60)
    assert_user_error(status, "pip install 'torchjob[k8s]'")


def test_a_current_directory_that_was_removed(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run(["bash", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "$@"', "-",
                           *TORCHJOB, "run", "--nproc-per-node", "1", "train.py"],
                          capture_output=True, text=True, env=env_for_tests(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("torchjob: the current directory no longer exists (it was removed "
                           "while this shell was in it): cd into a directory and run again\n")

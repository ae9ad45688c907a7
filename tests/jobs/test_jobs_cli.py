"""The torchjob command line, run as users run it: a subprocess, exit codes, stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"


def torchjob(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobs", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60)


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
    "type": ("name: x\nnproc_per_node: two\n", "but an integer"),
    "trainer-arg": ("name: x\ntrainer: {args: {schedule: linear}}\n", "trainer.args.schedule"),
    "secret-value": ("name: x\nsecrets: [{env: T, secret: s, key: k, value: v}]\n",
                     "secretKeyRef"),
    "yaml": ("name: [x\n", "not valid YAML"),
    "not-mapping": ("- 1\n", "top level must be a mapping"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["run", "render"])
def test_malformed_spec_exits_2_with_one_line(tmp_path: Path, name: str, command: str) -> None:
    text, fragment = MALFORMED[name]
    (tmp_path / "job.yaml").write_text(text)
    result = torchjob(command, "job.yaml", cwd=tmp_path)
    assert_user_error(result, "torchjob: job.yaml: ", fragment)
    assert not (tmp_path / "runs").exists()


def test_render_examples() -> None:
    default = torchjob("render", "--to", "local", str(EXAMPLES / "default.yaml"))
    assert default.returncode == 0 and default.stderr == ""
    (line,) = default.stdout.splitlines()
    assert "--nproc-per-node 2" in line and "-m trainer" in line and "--epochs 12" in line
    assert line.startswith("OMP_NUM_THREADS=")
    assert f"{sys.executable} -m trainer.agent" in line
    elastic = torchjob("render", str(EXAMPLES / "elastic.yaml"))
    lines = elastic.stdout.splitlines()
    # the rendezvous store first (its own process), the two agents, then the store stopped
    assert elastic.returncode == 0 and len(lines) == 4 and lines[-1] == "wait %2 %3; kill %1"
    assert "-m trainer.store --port" in lines[0]
    assert all("--nnodes 1:2" in line and line.endswith(" &") for line in lines[1:3])


def test_set_overrides_reach_the_command() -> None:
    result = torchjob("render", str(EXAMPLES / "default.yaml"), "--set", "trainer.args.epochs=3",
                      "--set", "nnodes=1:2", "--set", "env.FOO=bar baz")
    assert result.returncode == 0, result.stderr
    assert "--epochs 3" in result.stdout and "--nnodes 1:2" in result.stdout
    assert "FOO='bar baz'" in result.stdout


def test_run_dry_run_prints_and_starts_nothing(tmp_path: Path) -> None:
    result = torchjob("run", "--dry-run", str(EXAMPLES / "default.yaml"), cwd=tmp_path)
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
    (["status", "slurm:abc"], ["'abc' is not a Slurm job id"]),
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
    assert_user_error(torchjob(*args, cwd=tmp_path), *fragments)


@pytest.mark.parametrize("command", [[], ["run"], ["render"], ["submit"], ["status"], ["logs"],
                                     ["cancel"]])
def test_help(command: list[str]) -> None:
    result = torchjob(*command, "--help")
    assert result.returncode == 0 and "usage: torchjob" in result.stdout
    assert "--to" in result.stdout or not command


def test_missing_secret_exits_2_before_starting(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: x\nsecrets: [{env: TORCHJOB_TEST_UNSET, "
                                       "secret: s, key: k}]\n")
    result = torchjob("run", "job.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "TORCHJOB_TEST_UNSET" in result.stderr and "torch.distributed" not in result.stderr

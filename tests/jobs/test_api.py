"""The Python API (torchjob.jobs.api): the CLI's semantics and errors, as functions. Errors are
the very ones the command line prints (exit 2); a real local job is submitted, waited for,
read and listed through it (issue 27 part 4); the notebook example in docs/ runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from torchjob.jobs import api
from torchjob.jobs import backend as registry
from torchjob.jobs.backend import Backend, BackendError, Context, Handle, JobStatus, Request, \
    State
from torchjob.jobs.cli import main
from torchjob.jobs.load import SpecError
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import UserError
from tests.procs import PYTHON, ROOT, env_for_tests

DEFAULT = "jobs/examples/default.yaml"


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``torchjob ARGV`` says on stderr when it exits 2, without its ``torchjob: ``."""
    capsys.readouterr()
    assert main(list(argv)) == 2
    return capsys.readouterr().err.removeprefix("torchjob: ").rstrip("\n")


@pytest.fixture(autouse=True)
def at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_load_is_the_spec_with_overrides_as_set_makes_it() -> None:
    spec = api.load(DEFAULT, ["trainer.args.epochs=1", "nproc_per_node=1"])
    assert isinstance(spec, JobSpec)
    assert (spec.nproc_per_node, spec.trainer.args["epochs"]) == (1, 1)
    assert api.load(Path(DEFAULT)) == api.load(DEFAULT)
    with pytest.raises(TypeError, match="list of 'key=value'"):
        api.load(DEFAULT, "nnodes=2")  # type: ignore[arg-type]


@pytest.mark.parametrize("overrides, argv", [
    (["trainer.argz.epochs=1"], ["--set", "trainer.argz.epochs=1"]),
    (["nnodes=0"], ["--set", "nnodes=0"]),
])
def test_a_bad_override_is_the_clis_spec_error(
        overrides: list[str], argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecError) as caught:
        api.load(DEFAULT, overrides)
    assert caught.value.path and caught.value.path in str(caught.value)
    assert str(caught.value) == cli_error(capsys, "render", DEFAULT, *argv)


def test_a_missing_file_and_an_unknown_backend_are_the_clis_errors(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecError) as missing:
        api.load("no/such.yaml")
    assert str(missing.value) == cli_error(capsys, "render", "no/such.yaml")
    with pytest.raises(BackendError) as unknown:
        api.render(api.load(DEFAULT), to="nope")
    assert str(unknown.value) == cli_error(capsys, "render", "--to", "nope", DEFAULT)
    with pytest.raises(BackendError) as bare:
        api.status("12345")
    assert str(bare.value) == cli_error(capsys, "status", "12345")
    with pytest.raises(UserError) as tail:
        api.logs("local:x", tail=-1)
    assert str(tail.value) == cli_error(capsys, "logs", "local:x", "--tail", "-1")


def test_render_is_what_torchjob_render_prints(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["render", "--to", "local", DEFAULT]) == 0
    printed = capsys.readouterr().out
    assert api.render(api.load(DEFAULT), "local", source=DEFAULT) == printed


class Forever(Backend):
    """A job that never ends (to see ``wait``'s timeout)."""

    name = "forever"

    def render(self, spec: JobSpec, context: Context) -> Request:
        raise NotImplementedError

    def submit(self, request: Request) -> Handle:
        raise NotImplementedError

    def status(self, handle: Handle) -> JobStatus:
        return JobStatus(handle, State.RUNNING, detail="step 3")


def test_wait_with_a_timeout_says_what_it_saw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "get", lambda name: Forever())
    with pytest.raises(TimeoutError, match=r"forever:1: still RUNNING after 0.2 s \(step 3\)"):
        api.wait(Handle("forever", "1"), timeout=0.2)


@pytest.mark.integration
def test_a_local_job_submitted_and_waited_for(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The must-show: a real local job through the API: submitted, waited for (SUCCEEDED, exit
    code 0), its logs read (all, one rank's tail), listed by ``runs``."""
    spec = api.load(DEFAULT, ["trainer.args.max_steps=10", "nproc_per_node=1"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    handle = api.submit(spec, to="local")
    assert isinstance(handle, Handle) and str(handle).startswith("local:digits-"), handle
    final = api.wait(handle, timeout=600)
    assert (final.state, final.exit_code) == (State.SUCCEEDED, 0), final
    assert api.status(str(handle)) == final
    assert Path(final.run_dir).resolve() == (tmp_path / "runs" / "digits").resolve()
    every = list(api.logs(handle))
    assert any("done: steps 10" in line for line in every), every[-10:]
    ranked = [line for line in every if "[node 0 rank 0 attempt " in line]
    assert list(api.logs(handle, rank=0, tail=1)) == ranked[-1:]
    assert handle in [job.handle for job in api.runs(to="local")]


@pytest.mark.integration
def test_the_notebook_example_runs(tmp_path: Path) -> None:
    """docs/api_example.py, the README's "Python API" snippet, as a user runs it."""
    proc = subprocess.run([PYTHON, str(ROOT / "docs" / "api_example.py")], cwd=tmp_path,
                          env=env_for_tests(), capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("submitted local:digits-"), out
    assert out[1] == "SUCCEEDED 0", out
    assert out[-1] == "True", out


def test_the_readmes_snippet_is_the_example() -> None:
    """The README's "Python API" code block is docs/api_example.py (which the test above runs),
    but for the spec's path: the README's is relative to the repository."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    example = (ROOT / "docs" / "api_example.py").read_text().splitlines()
    for line in block.splitlines():
        if line.startswith("spec = load("):
            assert 'load(JOB, ["trainer.args.max_steps=10", "nproc_per_node=1"])' in \
                "\n".join(example)
        else:
            assert line in example, line

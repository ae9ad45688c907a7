"""The README, executed: its terminal sessions run and print what it shows
(tests/readme_sessions.py), the plain example commands are accepted, and the set-up commands
are the ones CI runs. Sessions that need the Slurm cluster or podman run with those tests
(tests/slurm, tests/containers); local jobs with the other tests of recorded runs (tests/jobs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.k8s.emulator import Emulator
from tests.procs import ROOT, env_for_tests, torchjob
from tests.readme_sessions import Command, match, run_session, sessions

README = (ROOT / "README.md").read_text()
HERE_SESSIONS = {"local", "docker-render", "slurm-render", "torchx", "k8s", "quick-local",
                 "quick-torchx", "quick-k8s"}
# run by tests/slurm, tests/containers and tests/jobs (test_local_runs.py)
ELSEWHERE = {"slurm", "docker", "local-jobs", "quick-slurm", "quick-docker"}


def test_every_session_is_run_by_some_test() -> None:
    found = set(sessions())
    assert found >= HERE_SESSIONS and not found - HERE_SESSIONS - ELSEWHERE, found


@pytest.mark.parametrize("name", ["docker-render", "slurm-render", "quick-k8s"])
def test_render_sessions(name: str, tmp_path: Path) -> None:
    run_session(sessions()[name], tmp_path)


def test_kubernetes_session_on_the_api_emulator(tmp_path: Path) -> None:
    with Emulator(operator=True) as emulator:
        config = emulator.kubeconfig(tmp_path / "kubeconfig")
        run_session(sessions()["k8s"], tmp_path, env={"KUBECONFIG": config})


@pytest.mark.integration
@pytest.mark.parametrize("name", ["local", "torchx", "quick-local", "quick-torchx"])
def test_sessions_that_train(name: str, tmp_path: Path) -> None:
    run_session(sessions()[name], tmp_path)


def test_the_matcher_reads_wildcards_and_handles() -> None:
    handles: dict[str, str] = {}
    assert match(["a ... c", "...", "submitted slurm:1"], ["a b c", "x", "y",
                                                         "submitted slurm:77"], handles) is None
    assert handles == {"slurm:1": "slurm:77"}
    assert match(["a"], ["b"], {}) is not None and match(["a", "..."], ["a"], {}) is None
    assert Command("torchjob run x.yaml  # exit 143").code == 143


def test_every_example_command_is_accepted() -> None:
    lines = [line.split("#")[0].strip() for line in README.splitlines()
             if line.startswith("torchjob ")]
    assert len(lines) >= 2
    for line in lines:
        argv = shlex.split(line)[1:]
        if argv[0] in ("run", "submit") and "--dry-run" not in argv:
            argv.append("--dry-run")  # training itself is tested in the sessions
        proc = torchjob(*argv, env=env_for_tests())
        assert proc.returncode == 0, f"{line}: {proc.stderr}"
        assert "--run-dir" in proc.stdout  # every rendering carries the trainer command


def test_the_error_example_prints_what_the_readme_says() -> None:
    match_ = re.search(r"^\$ (torchjob .*)\n(torchjob: .*)$", README, re.MULTILINE)
    assert match_
    proc = torchjob(*shlex.split(match_.group(1))[1:], env=env_for_tests())
    assert proc.returncode == 2
    assert proc.stderr.strip() == match_.group(2)


def test_setup_commands_are_the_ones_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/bootstrap test" in ci
    assert "\nbash scripts/bootstrap run\n" in README
    assert "\nbash scripts/bootstrap test\n" in README


def test_sessions_show_no_training_figures() -> None:
    """Floats from training differ between CPUs (0.9111 here, 0.9139 on an AVX-512 machine):
    a session shows a loss or an accuracy to one digit at most, the rest as ``...``."""
    figure = re.compile(r"\b(loss|accuracy|acc)[ =:]+\d+\.\d\d")
    shown = [line for commands in sessions().values() for command in commands
             for line in command.expected if figure.search(line)]
    assert not shown, f"training figures in the README's sessions: {shown}"


def test_the_field_reference_is_the_specs_own() -> None:
    """docs/spec.md's table of fields is generated from jobs/spec.py's help texts: regenerate
    it with python -m torchjob.jobs.spec when a field changes."""
    from torchjob.jobs.spec import reference
    doc = (ROOT / "docs" / "spec.md").read_text()
    generated = doc.split("-->\n", 1)[1].split("<!-- end generated -->")[0]
    assert generated == reference(), "docs/spec.md is stale: python -m torchjob.jobs.spec"

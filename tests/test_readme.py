"""The README's command examples are executed, so they cannot rot."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from tests.procs import PYTHON, ROOT, env_for_tests

README = (ROOT / "README.md").read_text()


def torchjob(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "jobs", *argv], cwd=ROOT, env=env_for_tests(),
                          capture_output=True, text=True, timeout=120)


def test_every_example_command_is_accepted() -> None:
    lines = [line.split("#")[0].strip() for line in README.splitlines()
             if line.startswith("torchjob ")]
    assert len(lines) >= 4
    for line in lines:
        argv = shlex.split(line)[1:]
        if argv[0] in ("run", "submit") and "--dry-run" not in argv:
            argv.append("--dry-run")  # training itself is tested in tests/integration
        proc = torchjob(argv)
        assert proc.returncode == 0, f"{line}: {proc.stderr}"
        assert "--run-dir" in proc.stdout  # every rendering carries the trainer command


def test_the_error_example_prints_what_the_readme_says() -> None:
    match = re.search(r"^\$ (torchjob .*)\n(.*)$", README, re.MULTILINE)
    assert match
    proc = torchjob(shlex.split(match.group(1))[1:])
    assert proc.returncode == 2
    assert proc.stderr.strip() == match.group(2)


def test_setup_commands_are_the_ones_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/bootstrap test" in ci
    assert "\nbash scripts/bootstrap run\n" in README
    assert "\nbash scripts/bootstrap test\n" in README

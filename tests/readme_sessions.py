"""The README's terminal sessions, executed: every ``$ torchjob ...`` it shows runs, and what it
prints must match what the README says it prints.

A session is one or more ```` ```console ```` blocks after a ``<!-- session: NAME -->``
comment; blocks of one name run in order, in one fresh directory (with ``jobs/`` of this
repository in it, so ``jobs/examples/...`` paths work). In the expected output:

- a line ``...`` stands for any number of lines (none included);
- ``...`` inside a line stands for any text (a time, a path, a run id);
- a handle (``slurm:1234``, ``local:digits-3f2a1b``, ``k8s:default/digits``) stands for
  whatever handle was printed there, and later commands that use the README's handle get the
  real one.

A command's exit code is 0 unless its line ends with ``# exit N``. Standard error is shown
after standard output when the command has ended (the README shows them in that order too).
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tests.procs import ROOT, env_for_tests, torchjob

README = ROOT / "README.md"
SESSION = re.compile(r"<!-- session: ([a-z0-9-]+) -->\s*```console\n(.*?)```", re.S)
HANDLE = re.compile(r"\b(?:local|docker|slurm(?::sbatch)?|k8s(?::trainjob)?|torchx):[^\s'\"]+")
EXIT = re.compile(r"\s+#\s*exit (\d+)\s*$")


@dataclass
class Command:
    line: str  # as the README shows it, after "$ "
    expected: list[str] = field(default_factory=list)

    @property
    def code(self) -> int:
        match = EXIT.search(self.line)
        return int(match.group(1)) if match else 0

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line, comments=True)


def sessions(text: str | None = None) -> dict[str, list[Command]]:
    """Every session of the README, its commands in order."""
    out: dict[str, list[Command]] = {}
    for name, block in SESSION.findall(text if text is not None else README.read_text()):
        commands = out.setdefault(name, [])
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append(Command(line[2:]))
            elif commands and commands[-1].line:
                commands[-1].expected.append(line)
    return out


def _pattern(line: str) -> tuple[re.Pattern[str], list[str]]:
    """A regex for one expected line, and the README handles it captures, in order."""
    handles: list[str] = []
    parts = []
    pos = 0
    for match in HANDLE.finditer(line):
        parts.append(re.escape(line[pos:match.start()]).replace(r"\.\.\.", ".*"))
        parts.append(r"(\S+?)" if match.end() < len(line) else r"(\S+)")
        handles.append(match.group(0))
        pos = match.end()
    parts.append(re.escape(line[pos:]).replace(r"\.\.\.", ".*"))
    return re.compile("".join(parts)), handles


def match(expected: list[str], actual: list[str], handles: dict[str, str]) -> str | None:
    """None when ``actual`` matches ``expected`` (recording handles), else what differs."""
    def walk(i: int, j: int) -> bool:
        if i == len(expected):
            return j == len(actual)
        if expected[i] == "...":
            return any(walk(i + 1, k) for k in range(j, len(actual) + 1))
        if j == len(actual):
            return False
        pattern, names = _pattern(expected[i])
        found = pattern.fullmatch(actual[j])
        if not found:
            return False
        saved = dict(handles)
        handles.update(zip(names, found.groups()))
        if walk(i + 1, j + 1):
            return True
        handles.clear()
        handles.update(saved)
        return False

    if walk(0, 0):
        return None
    return ("expected:\n" + "\n".join(expected) + "\n--- but it printed:\n" + "\n".join(actual))


def run_session(commands: list[Command], workdir: Path, env: dict[str, str] | None = None,
                timeout: float = 600, copy: bool = False) -> dict[str, str]:
    """Run ``commands`` in ``workdir`` and fail with what differed; the handles seen (the
    README's, each to the real one). ``jobs/`` there is this repository's (a link), or with
    ``copy`` a copy of its examples (for containers, which see the working directory alone)."""
    if copy:
        shutil.copytree(ROOT / "jobs" / "examples", workdir / "jobs" / "examples",
                        ignore=shutil.ignore_patterns("__pycache__"))
    else:
        (workdir / "jobs").symlink_to(ROOT / "jobs")
    handles: dict[str, str] = {}
    for command in commands:
        argv = [handles.get(word, word) for word in command.argv]
        assert argv[0] == "torchjob", f"README sessions run torchjob only: {command.line}"
        proc = torchjob(*argv[1:], cwd=workdir, env=env_for_tests(**(env or {})),
                        timeout=timeout)
        actual = (proc.stdout + proc.stderr).splitlines()
        assert proc.returncode == command.code, (
            f"$ {command.line}\nexit {proc.returncode}, the README says {command.code}:\n"
            + "\n".join(actual[-40:]))
        problem = match(command.expected, actual, handles)
        assert problem is None, f"$ {command.line}\n{problem}"
    return handles

"""A user's script ends under ``python -m torchjob.trainer.script`` as under ``python`` itself:
the same exit code, the same standard error (its own excepthook, its traceback from its own
first frame, a SyntaxError's lines alone) and the same files (what it left unclosed is written),
though the runner leaves without the interpreter's C++ teardown (trainer/script.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests

SCRIPTS = {
    "unclosed": "log = open('out.txt', 'w')\nlog.write('never closed\\n')\n"
                "raw = open('out.bin', 'wb')\nraw.write(b'bytes')\n",
    "excepthook": "import sys\n"
                  "def hook(kind, exc, tb):\n"
                  "    print(f'HOOK {kind.__name__}: {exc}', file=sys.stderr)\n"
                  "    open('out.txt', 'w').write('hook ran')\n"
                  "sys.excepthook = hook\nraise RuntimeError('boom')\n",
    "traceback": "def f():\n    raise ValueError('bad\\nsecond line')\nf()\n",
    "syntax": "x = (\n",
    "assert": "assert 1 == 2\n",
}


def run(argv: list[str], cwd: Path) -> tuple[int, str, dict[str, bytes]]:
    """Its exit code, standard error and the files it wrote (then removed)."""
    done = subprocess.run(argv, cwd=cwd, env=env_for_tests(), capture_output=True, text=True,
                          timeout=120)
    files = {p.name: p.read_bytes() for p in sorted(cwd.glob("out.*"))}
    for name in files:
        (cwd / name).unlink()
    return done.returncode, done.stderr, files


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_ends_as_under_python(tmp_path: Path, name: str) -> None:
    (tmp_path / "train.py").write_text(SCRIPTS[name])
    seen = [run([PYTHON, *head, "train.py"], tmp_path)
            for head in ([], ["-m", "torchjob.trainer.script"])]
    assert seen[1] == seen[0], seen
    if name == "unclosed":
        assert seen[0][2] == {"out.bin": b"bytes", "out.txt": b"never closed\n"}

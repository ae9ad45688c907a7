"""Checks made before anything is submitted that look at files here: unwritable run or
checkpoint directories, and checkpoints of another training configuration, are refused with
exit 2 where the nodes see this machine's run directory (``Backend.sees_run_dir``); elsewhere
the trainer refuses them on the nodes (trainer.checkpoint), with the same message. A user's
script that does not compile is refused where the nodes run it with this machine's Python;
where they run an image's, which may read newer syntax, it is a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from torchjob.jobs.spec import JobSpec
from torchjob.jobs.trainer_args import trainer_argv
from torchjob.jobs.values import UserError
from torchjob.trainer.contract import MANIFEST
from torchjob.trainer.dirs import unusable
from torchjob.trainer.fingerprint import differences, refusal


def newest_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest of the newest finished checkpoint under ``root``, if any can be read."""
    if not root.is_dir():
        return None
    for step in sorted(root.glob("step_*"), reverse=True):
        try:
            manifest = json.loads((step / MANIFEST).read_text())
        except (OSError, ValueError):
            continue  # unfinished or damaged: the trainer falls back past it too
        if isinstance(manifest, dict):
            return manifest
    return None


# a module of the user's that ``python -m torchjob...`` would import instead of the kit: the
# directory a node starts in comes first on sys.path
SHADOWS = ("torchjob.py", "torchjob/__init__.py")


def check_shadowing(cwd: str | Path) -> None:
    """UserError (exit 2) when the directory the nodes start in holds a ``torchjob`` module of
    its own: every node's agent (``python -m torchjob.trainer.agent``) would import and run
    it instead of the kit, and fail far from the cause."""
    import torchjob

    kit = getattr(torchjob, "__file__", None)  # None: a namespace package, as installed
    for name in SHADOWS:
        found = Path(cwd, name)
        if found.is_file() and (kit is None or found.resolve() != Path(kit).resolve()):
            raise UserError(f"{found}: every node would import this file instead of torchjob "
                            "(`python -m torchjob.trainer.agent` puts the directory it starts in "
                            f"first on sys.path) and run it: rename it (e.g. to train.py) and "
                            "run again")


def check_dirs(spec: JobSpec, cwd: str | Path) -> None:
    """UserError (exit 2) when the run or checkpoint directory could not be written (a file on
    its path, no permission, a read-only file system): before anything starts, not at the
    first save (torchjob.trainer.dirs; the trainer checks again on its nodes)."""
    for field in ("run_dir", "checkpoint_dir"):
        value = getattr(spec, field)
        problem = unusable(Path(cwd, value))
        if problem is not None:
            raise UserError(f"{field}: {value!r}: {problem}")


def check_checkpoints(spec: JobSpec, cwd: str | Path) -> None:
    """UserError (exit 2) when the built-in trainer would refuse the checkpoints it finds."""
    if not spec.trainer.builtin or spec.resume != "auto":
        return
    from torchjob.trainer import config  # the trainer's own parser: the config its workers build

    manifest = newest_manifest(Path(cwd, spec.checkpoint_dir))
    if manifest is None or not isinstance(manifest.get("config"), dict):
        return
    cfg = config.parse_args([*trainer_argv(spec.trainer.args), "--run-dir", spec.run_dir,
                             "--checkpoint-dir", spec.checkpoint_dir])
    diffs = differences(manifest["config"], dataclasses.asdict(cfg))
    if diffs:
        raise UserError(refusal(spec.checkpoint_dir, diffs))


# compiles the file argv[1] as ``python FILE`` would (no code runs) and prints what is wrong
COMPILE = ("import json, sys\ntry:\n    compile(open(sys.argv[1], 'rb').read(), sys.argv[1], "
           "'exec', dont_inherit=True)\nexcept (SyntaxError, ValueError) as exc:\n"
           "    print(json.dumps([type(exc).__name__, getattr(exc, 'msg', str(exc)), "
           "getattr(exc, 'lineno', None), getattr(exc, 'text', None)]))\n"
           "print(json.dumps(list(sys.version_info[:2])))")


def entry_file(spec: JobSpec, cwd: Path, here: bool) -> Path | None:
    """The file the nodes run first, when it is here to read: a script (relative, or absolute
    when ``here``: the nodes see this machine's files), a directory's ``__main__.py``, or
    ``trainer.module``'s file under ``cwd`` (``pkg/train.py``, ``pkg/train/__main__.py``)."""
    if spec.trainer.builtin:
        return None
    if spec.trainer.script is not None:
        script = Path(spec.trainer.script)
        if script.is_absolute() and not here:
            return None  # in the image, not here
        found = cwd / script
        if found.is_dir():
            found = found / "__main__.py"
        return found if found.is_file() and not zipfile.is_zipfile(found) else None
    base = cwd.joinpath(*spec.trainer.module.split("."))
    for found in (base.with_name(base.name + ".py"), base / "__main__.py"):
        if found.is_file():
            return found
    return None


def compile_problem(path: Path, python: str | None) -> tuple[str, tuple[int, int]] | None:
    """Why ``path`` does not compile under ``python`` (None: this interpreter), and that
    Python's version; None when it compiles or cannot be read or checked. Asked once per
    version of the file (a sweep's jobs share it)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _compile_problem(str(path), python or sys.executable, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _compile_problem(path: str, python: str, *stamp: int) -> tuple[str, tuple[int, int]] | None:
    command = [python, "-I", "-c", COMPILE, path]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        *found, version = [json.loads(line) for line in done.stdout.splitlines()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None  # no such interpreter, a file it cannot read: the nodes will say
    if not found:
        return None
    kind, msg, line, text = found[0]
    where = f"{path}, line {line}" if line else str(path)
    text = text.strip() if isinstance(text, str) else ""
    shown = f": {text[:100]}{'...' if len(text) > 100 else ''}" if text else ""
    return f"{kind}: {msg} ({where}{shown})", (version[0], version[1])


def check_syntax(spec: JobSpec, cwd: str | Path, python: str | None) -> None:
    """UserError (exit 2) when the user's script or module does not compile under ``python``,
    the interpreter here the nodes run it with; with ``python`` None (the nodes run an image's
    or a cluster's own), this machine's Python checks it, and a failure is a warning."""
    path = entry_file(spec, Path(cwd), here=python is not None)
    problem = None if path is None else compile_problem(path, python)
    if problem is None:
        return
    what = (f"trainer.script {spec.trainer.script!r}" if spec.trainer.script is not None
            else f"trainer.module {spec.trainer.module!r}")
    (text, (major, minor)) = problem
    if python is not None:
        raise UserError(f"{what} does not compile under the nodes' Python {major}.{minor}: "
                        f"{text}; fix it and run again (nothing was submitted)")
    print(f"torchjob: warning: {what} does not compile under this machine's Python "
          f"{major}.{minor}: {text}; going on, as the nodes run it with their own Python, "
          "which may read newer syntax", file=sys.stderr, flush=True)

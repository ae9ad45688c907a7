"""Checks made before anything is submitted that look at the run directory: unwritable run or
checkpoint directories, and checkpoints of another training configuration, are refused with
exit 2 where the nodes see this machine's run directory (``Backend.sees_run_dir``); elsewhere
the trainer refuses them on the nodes (trainer.checkpoint), with the same message.
"""

from __future__ import annotations

import dataclasses
import json
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

"""The directories a job writes (its run and checkpoint directories): usable, or why not.
Checked before any work (jobs.preflight, and every rank at its start), so that an unusable
one ends the job at once with exit 2, not at the first checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

TORCH_WRITER = "inline_container.cc"  # torch.save's zip writer, in the errors it raises


def unusable(path: str | os.PathLike[str]) -> str | None:
    """Why a job could not write in ``path`` (made with its parents when missing), or None.

    The nearest existing directory is probed with a file of its own, created and removed at
    once, so that what decides is what the job would meet: permissions, a read-only file
    system, an immutable directory, whether or not the caller is root."""
    path = Path(path)
    existing = path
    while not os.path.lexists(existing):
        if existing.parent == existing:
            break
        existing = existing.parent
    where = str(existing) if existing == path else f"{existing} (on its path)"
    if existing.is_symlink() and not existing.exists():
        return f"{where} is a broken symbolic link: remove it or point it at a directory"
    if not existing.is_dir():
        return f"{where} is a file, not a directory: name a directory (or move the file away)"
    try:
        fd, probe = tempfile.mkstemp(prefix=".torchjob-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return (f"{where} cannot be written ({exc.strerror or exc}): choose a directory you "
                "can write, or change its permissions")
    return None


def write_whole(path: Path, text: str, tmp: Path) -> None:
    """``text`` into ``path`` whole or not at all: written to ``tmp`` and renamed over it. A
    write that fails (a full disk, a quota) removes ``tmp`` and raises: no half file stays."""
    try:
        tmp.write_text(text)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_failure(exc: BaseException) -> str | None:
    """What the file system refused, behind ``exc``, or None when it was no write: an OSError
    (itself, or what it was raised from or while handling: torch.save reports a full disk as
    its zip writer's RuntimeError, raised while handling the OSError), or that zip writer's
    error alone (one rank's failure inside torch.distributed.checkpoint's, pickled to the
    others without what it was raised while handling)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    short = None
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            return current.strerror or str(current)
        if isinstance(current, RuntimeError) and TORCH_WRITER in str(current):
            short = f"a write fell short, as on a full disk ({str(current).strip()[:200]})"
        failures = getattr(current, "failures", None)  # CheckpointException: rank -> (exc, tb)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [current.__cause__, current.__context__]
    return short


def free_space(path: str | os.PathLike[str]) -> str:
    """What is free on ``path``'s file system, for a message: "12 MiB" (or "an unknown
    amount")."""
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.0f} MiB"
    except OSError:
        return "an unknown amount"


class WriteRefused(RuntimeError):
    """A file of the run the file system refused (full, over quota, read-only)."""


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Writes to the run's file ``path``: an OSError says which file, what is free there and
    what to do (a write's own error names no file)."""
    try:
        yield
    except OSError as exc:
        free = free_space(path.parent)
        raise WriteRefused(f"cannot write {path}: {exc.strerror or exc} ({free} free there): "
                           "free space there, or set run_dir to another file system, and run "
                           "the job again to resume") from exc

"""The directories a job writes (its run and checkpoint directories): usable, or why not.
Checked before any work (jobs.preflight, and every rank at its start), so that an unusable
one ends the job at once with exit 2, not at the first checkpoint.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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

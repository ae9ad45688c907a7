"""The trainer package's digest: its ``.py`` files' paths and bytes, in path order. An image
torchjob builds carries it as a label (jobs/images.py compares it with the
installed package's). The standard library only, so that scripts/container-setup runs this
file from a build context where torchjob is not installed: ``python3 trainer/digest.py``."""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def digest(root: Path = ROOT) -> str:
    """The digest of the package in ``root`` (default: this one), 16 hex digits."""
    total = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        total.update(path.relative_to(root).as_posix().encode() + b"\0")
        total.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return total.hexdigest()[:16]


if __name__ == "__main__":
    print(digest())

"""Golden files: a whole output compared with the file that holds it. After an intended change,
``TORCHJOB_REGEN_GOLDEN=1`` rewrites the files instead; review their diff and commit it."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

REGEN = "TORCHJOB_REGEN_GOLDEN"


def assert_golden(text: str, path: Path) -> None:
    """``text`` is the content of ``path``, whole; with ``TORCHJOB_REGEN_GOLDEN=1`` it is written
    there first."""
    if os.environ.get(REGEN) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    golden = path.read_text()
    assert text == golden, (
        f"{path} is not what the test made; after an intended change, regenerate with "
        f"{REGEN}=1 and review the diff:\n" + "".join(difflib.unified_diff(
            golden.splitlines(keepends=True), text.splitlines(keepends=True), str(path),
            "made now")))

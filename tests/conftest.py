"""For every test: torchjob's per-user run index (``torchjob.jobs.runs``) in a temporary directory
instead of the user's ``~/.local/state``: the local and docker runs that tests start are
recorded like any other run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def run_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``XDG_STATE_HOME`` for this session (inherited by every process a test starts)."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = path = str(tmp_path_factory.mktemp("state"))
    yield path
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before

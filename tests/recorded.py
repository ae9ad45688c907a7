"""Helpers for tests of recorded runs (``torchjob.jobs.runs``: local and docker runs as jobs): the
command line as another terminal runs it, and waits on a run's state with what was seen."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from tests.procs import env_for_tests, torchjob


def submit(to: str, job: Path, cwd: Path, *sets: str) -> str:
    """``torchjob submit --to TO JOB --set ...``: the handle it printed."""
    proc = torchjob("submit", "--to", to, str(job), *[a for s in sets for a in ("--set", s)],
                    cwd=cwd, env=env_for_tests(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    handle = proc.stdout.strip()
    assert handle.startswith(f"{to}:"), proc.stdout
    return handle


def status(handle: str, cwd: Path) -> dict[str, Any]:
    """``torchjob status --json HANDLE``, parsed."""
    proc = torchjob("status", "--json", handle, cwd=cwd, env=env_for_tests())
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


def wait_until(check: Callable[[], Any], timeout: float, what: str,
               seen: Callable[[], object]) -> Any:
    """``check()`` once it is true; else fail saying what was awaited and what was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"after {timeout:g} s still waiting for {what}; saw: {seen()}")

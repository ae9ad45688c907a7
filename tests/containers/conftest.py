"""The trainer's image, built locally by ``scripts/container-setup``, as a session fixture.

Tests that use ``container_image`` are marked ``integration`` and ``containers``. When podman
or the image cannot be set up (no root, not Debian/Ubuntu, no package mirror, ...) they are
skipped with the reason; in CI (``CI=true``) that is a failure instead, since a skip there
would hide a broken image.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.procs import ROOT

SETUP = ROOT / "scripts" / "container-setup"
IMAGE = "localhost/torchjob:latest"
SETUP_TIMEOUT_S = 1800  # first run: apt-get, debootstrap (~45 s), the image build (~1-2 min)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


@pytest.fixture(scope="session")
def container_image() -> str:
    """Run ``scripts/container-setup`` once per session (seconds when up to date); the image."""
    try:
        proc = subprocess.run(["bash", str(SETUP), "all"], capture_output=True, text=True,
                              timeout=SETUP_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
        code: int | None = proc.returncode
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        output = "".join(
            s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
            for s in (exc.stdout, exc.stderr))
        output += f"\n(timed out after {SETUP_TIMEOUT_S} s)"
    if code != 0:
        why = "cannot run here" if code == 2 else f"exit code {code}"
        reason = f"scripts/container-setup failed ({why}):\n{_tail(output)}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return IMAGE

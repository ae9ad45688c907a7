"""The trainer's image, built locally by ``scripts/container-setup``, as a session fixture.

Tests that use ``container_image`` are marked ``integration`` and ``containers``. When podman
or the image cannot be set up (no root, not Debian/Ubuntu, no package mirror, ...) they are
skipped with the reason; in CI (``CI=true``) that is a failure instead, since a skip there
would hide a broken image.
"""

from __future__ import annotations


import pytest

from tests.procs import ROOT, require_setup

SETUP = ROOT / "scripts" / "container-setup"
IMAGE = "localhost/torchjob:latest"
SETUP_TIMEOUT_S = 1800  # first run: apt-get, debootstrap (~45 s), the image build (~1-2 min)


@pytest.fixture(scope="session")
def container_image() -> str:
    """Run ``scripts/container-setup`` once per session (seconds when up to date); the image."""
    require_setup(["bash", str(SETUP), "all"], timeout=SETUP_TIMEOUT_S,
                  what="scripts/container-setup")
    return IMAGE

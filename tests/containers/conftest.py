"""The trainer's image, built locally by ``scripts/container-setup``, as a session fixture.

Tests that use ``container_image`` are marked ``integration`` and ``containers``. When podman
or the image cannot be set up (no root, not Debian/Ubuntu, no package mirror, ...) they are
skipped with the reason; in CI (``CI=true``) that is a failure instead, since a skip there
would hide a broken image.
"""

from __future__ import annotations

import os

import pytest

from tests.procs import ROOT, require_setup

SETUP = ROOT / "scripts" / "container-setup"
# TORCHJOB_TEST_IMAGE: build and test an image under a tag of your own (a shared machine's
# localhost/torchjob:latest may be someone else's)
IMAGE = os.environ.get("TORCHJOB_TEST_IMAGE") or "localhost/torchjob:latest"
SETUP_TIMEOUT_S = 1800  # first run: apt-get, debootstrap (~45 s), the image build (~1-2 min)


@pytest.fixture(scope="session")
def container_image() -> str:
    """Run ``scripts/container-setup`` once per session (seconds when up to date); the image."""
    require_setup(["bash", str(SETUP), "all"], timeout=SETUP_TIMEOUT_S,
                  what="scripts/container-setup", env={**os.environ, "IMAGE": IMAGE})
    return IMAGE

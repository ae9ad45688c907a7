"""The hang watchdog on a user's unmodified script on the real two-node Slurm cluster: a hang
shape and a culprit drawn at random among 2 nodes x 2 ranks, named as on local and docker
(tests/integration/hang_trials.py)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.hang_trials import SHAPES, trial

if TYPE_CHECKING:
    from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_the_culprit_is_named_on_slurm(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    shape = random.choice(sorted(SHAPES))
    trial(tmp_path / "job", "slurm", shape, name=f"hang-{uuid.uuid4().hex[:6]}")

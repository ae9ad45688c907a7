"""The hang watchdog on a user's unmodified script in node containers (``--to docker``): a hang
shape drawn at random (every shape runs on local each time, tests/integration/
test_hang_culprit.py; one here, as on Slurm), the culprit drawn at random among 2 containers
x 1 rank (alone on its node, so named through the store's exchange between the nodes), must
be the one named (tests/integration/hang_trials.py), and no container is left behind."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.containers.test_compose_run import PROJECT, assert_nothing_left
from tests.integration.hang_trials import SHAPES, trial

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def test_the_culprit_is_named_in_containers(container_image: str, tmp_path: Path) -> None:
    shape = random.choice(sorted(SHAPES))
    for parent in tmp_path.parents:  # pytest's temporary directories are private
        if parent == Path("/tmp"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)
    cwd = tmp_path / "job"
    cwd.mkdir(mode=0o755)
    out = trial(cwd, "docker", shape, nproc=1)
    project = PROJECT.search(out)
    assert project is not None, out[-3000:]
    assert_nothing_left(project.group(1))

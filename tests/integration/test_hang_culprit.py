"""The hang watchdog on a user's unmodified script, on the local backend: every hang shape
(a stopped process, a Python loop, a sleep, a blocked read), the culprit drawn at random
among 2 nodes x 2 ranks, must be the one named (tests/integration/hang_trials.py). The docker
and Slurm trials: tests/containers/test_hang_containers.py, tests/slurm/test_slurm_hang.py.
And where the script's own process group timeout is far below the watchdog's, the collective
that times out waiting for the culprit (one shape drawn at random) names it (one node: the
rank waited for is on the node of a rank that timed out), and a rank that never reaches
init_process_group on node 1 is named from its node-mate's wait there, which ended when node
0's rank 0 (the workers' store) timed out and left."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.integration.hang_trials import SHAPES, trial

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_culprit_is_named_on_local(tmp_path: Path, shape: str) -> None:
    trial(tmp_path, "local", shape)


def test_a_timed_out_collective_names_the_rank_it_waited_for(tmp_path: Path) -> None:
    # one shape drawn at random (its failure says which), as in containers and on Slurm: the
    # collective's timeout is the same for every shape, and each shape's own detection runs
    # above every time
    shape = random.choice(["io", "loop", "stop"])
    trial(tmp_path, "local", shape, nodes=1, name=f"timeout-{shape}", pg_timeout=5)


def test_a_rank_that_never_reaches_init_is_named_when_the_store_host_gives_up(
        tmp_path: Path) -> None:
    # its node-mate is named only when it waited INIT_WAIT_S in init_process_group before rank
    # 0 gave up: rank 0 enters init after every other rank (hang_shapes.all_at_init), as a
    # timeout alone (5 s, then 10 s) was no margin for the nodes' start-up skew in loaded CI
    trial(tmp_path, "local", "io", on_node=1, name="init-timeout", pg_timeout=10)

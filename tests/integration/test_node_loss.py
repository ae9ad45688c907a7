"""An elastic job (nnodes 1:2, two local agents, its own rendezvous store: trainer.store) that
loses a node mid-run, either one: the agent is killed, its workers go with it within seconds
(trainer.orphans), the survivor re-forms the group at the smaller size, finishes, and the job
exits 0; node 0's finished line and the summary list the change of membership
(trainer.ledger). The store itself lost ends the agents with a line that says so, not a hang.
Compose and Slurm: tests/containers/test_compose_run.py and tests/slurm/test_sbatch_run.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.procs import (TORCHJOB, alive, cmdline, children, descendants, env_for_tests,
                         last_step, wait_for)
from torchjob.trainer.contract import EXIT_STORE_LOST, FINISHED

pytestmark = pytest.mark.integration
TRIALS = int(os.environ.get("TORCHJOB_TRIALS", "1"))  # more by hand
GONE_S = 10.0  # the bound: no worker of a killed agent left 10 s later
JOB = """\
name: loss
nnodes: "1:2"
nproc_per_node: 1
max_restarts: 3
local:
  nodes: 2
trainer:
  module: torchjob.trainer
  args: {epochs: 30, log_every: 1, eval_every: 0, progress: lines, checkpoint_every: 20}
"""


def agents(launcher: int) -> list[int]:
    """The launcher's node agents, in the order it started them."""
    return sorted(pid for pid in children(launcher) if "torchjob.trainer.agent" in cmdline(pid))


def store(launcher: int) -> list[int]:
    """The launcher's rendezvous store process (torchjob.trainer.store)."""
    return [pid for pid in children(launcher) if "torchjob.trainer.store" in cmdline(pid)]


@contextlib.contextmanager
def training(tmp_path: Path, rdzv: str = "c10d"
             ) -> Iterator[tuple[subprocess.Popen[bytes], list[int], int, IO[str]]]:
    """``torchjob run`` of JOB with the rendezvous backend ``rdzv``, once it trained 25 steps:
    (the launcher, its two node agents, its store, its output so far); killed at the end if
    still running."""
    (tmp_path / "job.yaml").write_text(JOB + f"rdzv: {{backend: {rdzv}}}\n")
    log = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen([*TORCHJOB, "run", "job.yaml"], cwd=tmp_path,
                            env=env_for_tests(), stdout=log, stderr=subprocess.STDOUT)
    try:
        nodes = wait_for(lambda: len(found := agents(proc.pid)) == 2 and found, 60,
                         "two node agents")
        wait_for(lambda: last_step(tmp_path / "runs" / "loss") >= 25 or proc.poll() is not None,
                 120, "step 25")
        stores = store(proc.pid)
        assert len(stores) == 1, f"no rendezvous store of its own: {stores}"
        yield proc, nodes, stores[0], log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.seek(0)


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("lost, rdzv", [(0, "c10d"), (0, "torchjob")])  # the other node:
# tests/containers/test_compose_run.py and tests/slurm/test_sbatch_run.py lose each in turn
def test_killing_a_node_agent_leaves_no_worker_and_the_job_finishes(tmp_path: Path, lost: int,
                                                                    rdzv: str,
                                                                    trial: int) -> None:
    """Node 0: the one torchrun's endpoint would point at, and rank 0 of either rendezvous,
    whose agent serves the workers' store (trainer.rendezvous for torchjob)."""
    with training(tmp_path, rdzv) as (proc, nodes, rendezvous, log):
        workers = descendants(nodes[lost])
        assert workers, f"no process under agent {nodes[lost]}"
        os.kill(nodes[lost], signal.SIGKILL)
        wait_for(lambda: not any(alive(pid) for pid in workers), GONE_S,
                 f"the killed agent's processes {workers} to end")
        code = proc.wait(timeout=300)
    out = log.read()
    assert code == 0, out[-4000:]
    finished = [line for line in out.splitlines() if FINISHED in line]
    assert finished and "left" in finished[-1] and "world size 1" in finished[-1], out[-4000:]
    assert "the job finished without node" in out, out[-4000:]
    assert "RendezvousConnectionError" not in out and "TCPStore.cpp" not in out, out[-4000:]
    assert not alive(rendezvous), "the store outlived the run"
    summary = json.loads((tmp_path / "runs" / "loss" / "summary.json").read_text())
    assert summary["restarts"] >= 1 and any("left" in m for m in summary["membership"]), summary


def test_a_lost_store_ends_the_agents_with_a_line_that_says_so(tmp_path: Path) -> None:
    """Not the job's fault: the agents, which met at the store, end with EXIT_STORE_LOST (a
    retryable code); run again, the job resumes from its last checkpoint."""
    with training(tmp_path) as (proc, nodes, rendezvous, log):
        os.kill(rendezvous, signal.SIGKILL)
        code = proc.wait(timeout=120)
    out = log.read()
    assert code == EXIT_STORE_LOST, out[-3000:]
    assert "torchjob: the rendezvous store ended (exit -9) while nodes run" in out, out[-3000:]
    assert "torchjob: the job failed: the rendezvous store was lost" in out, out[-3000:]
    assert not any(alive(pid) for pid in nodes), "an agent outlived its store"

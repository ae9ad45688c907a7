"""torchrun's static rendezvous (``--nnodes 2 --node-rank N --master-addr``, as Kubeflow's
fixed-size PyTorchJob and TrainJob's torch plugin start it) through a restart: two agents on
this host, each attempt a round of its own (torchjob.trainer.static_rounds). Before, the second
attempt read the first one's worker addresses and verdict: a wrong cause, or a wait forever.
And a node whose agent is killed and started again (a restarted pod) joins the others."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, descendants, env_for_tests, free_port, wait_for
from tests.trainer.test_agent import end_all

# attempt 0: rank 1 is killed (a lost worker: restarted); attempt 1: rank 0 exits 3 (a bug:
# not retried). Every node must end on attempt 1's cause.
FAILS_TWICE = """\
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {dist.get_rank()} in attempt {attempt}", flush=True)
dist.barrier()
if attempt == 0 and dist.get_rank() == 1:
    os.kill(os.getpid(), 9)
if attempt == 1 and dist.get_rank() == 0:
    sys.exit(3)
dist.barrier()
"""

# attempt 0: rank 1 hangs; attempt 1: rank 0 does. The watchdog must name each attempt's own.
HANGS_TWICE = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.barrier()
if dist.get_rank() == (1 if attempt == 0 else 0):
    time.sleep(600)  # the hang
dist.barrier()
"""

# ten seconds of all-reduces
LONG = """\
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} started", flush=True)
for _ in range(100):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
print(f"rank {dist.get_rank()} done", flush=True)
"""

DEADLINE_S = 120  # each run takes 5-25 s here


def static_node(script: Path, port: int, node: int, log: Path,
                *own: str) -> subprocess.Popen[str]:
    """One static node of one process, with one restart."""
    return subprocess.Popen(
        [PYTHON, "-m", "torchjob.trainer.agent", *own, "--nnodes", "2", "--node-rank", str(node),
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "1",
         "--max-restarts", "1", str(script)],
        env=env_for_tests(), stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


def static_nodes(tmp_path: Path, script: str, *own: str) -> list[str]:
    """Run ``script`` on two static nodes; each agent's exit code must be 1 (the job
    failed): their logs."""
    path = tmp_path / "job.py"
    path.write_text(script)
    port, logs = free_port(), [tmp_path / f"node{i}.log" for i in range(2)]
    agents = [static_node(path, port, i, log, *own) for i, log in enumerate(logs)]
    try:
        for agent, log in zip(agents, logs):
            try:
                code = agent.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"an agent still runs after {DEADLINE_S} s:\n"
                            + "\n".join(p.read_text()[-1500:] for p in logs))
            assert code == 1, log.read_text()[-2000:]
    finally:
        end_all(agents)
    return [log.read_text() for log in logs]


@pytest.mark.integration
def test_static_nodes_restart_together_and_end_on_the_second_attempts_cause(
        tmp_path: Path) -> None:
    logs = static_nodes(tmp_path, FAILS_TWICE)
    for node, text in enumerate(logs):
        assert f"rank {node} in attempt 1" in text, text[-2000:]  # both restarted, together
        last = text.strip().splitlines()[-1]
        assert "the job failed" in last and "node 0 rank 0 exited with code 3" in last, \
            f"node {node} ended on another cause:\n{text[-2000:]}"
        assert "(attempt 1, exit 1)" in last, last
        assert "Connection refused" not in text, text[-2000:]  # no last attempt's address


@pytest.mark.integration
def test_a_hang_after_a_static_restart_names_that_attempts_rank(tmp_path: Path) -> None:
    logs = static_nodes(tmp_path, HANGS_TWICE, "--hang-timeout", "6")
    for node, text in enumerate(logs):
        assert "node 1 rank 1 hung" in text, text[-2000:]  # attempt 0's culprit
        last = text.strip().splitlines()[-1]
        assert "the job failed" in last and "node 0 rank 0 hung" in last \
            and "job.py:7 in <module>" in last, \
            f"node {node} blamed another rank in attempt 1:\n{text[-2000:]}"


@pytest.mark.integration
def test_a_static_node_whose_agent_starts_again_joins_the_next_round(tmp_path: Path) -> None:
    path = tmp_path / "job.py"
    path.write_text(LONG)
    port, logs = free_port(), [tmp_path / name for name in ("node0.log", "node1.log",
                                                           "node1-again.log")]
    agents = [static_node(path, port, i, logs[i]) for i in range(2)]
    try:
        wait_for(lambda: "rank 1 started" in logs[1].read_text() or agents[1].poll() is not None,
                 DEADLINE_S, "node 1's worker in its loop")
        for pid in [*descendants(agents[1].pid), agents[1].pid]:  # the node's agent and its
            os.kill(pid, signal.SIGKILL)  # worker (in a session of its own): a lost pod
        agents[1].wait()
        agents.append(static_node(path, port, 1, logs[2]))
        for agent in (agents[0], agents[2]):
            try:
                code = agent.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"an agent still runs after {DEADLINE_S} s:\n"
                            + "\n".join(p.read_text()[-1500:] for p in logs))
            assert code == 0, "\n".join(p.read_text()[-1500:] for p in logs)
    finally:
        end_all(agents)
    assert "[node 0 rank 0 attempt 1] rank 0 done" in logs[0].read_text(), logs[0].read_text()
    assert "rank 1 done" in logs[2].read_text(), logs[2].read_text()

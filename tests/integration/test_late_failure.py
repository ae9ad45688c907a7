"""A failure after another node's workers all finished (a rank that crashes while writing its
results, after the last collective): torch's finished node waited in its exit barrier for
its whole timeout (300 s; the local and docker launchers stopped it sooner, 143, with C++
stack traces of its store client), said "the job finished" first, and the failing node
waited 10 s for it to read the verdict. Now the finished node hears the failure and leaves
at once, and a restart is not said once a node has finished (a restart needs every node);
said first, the finished node restarts with the others (torchjob.trainer.round_verdict); and
a node whose workers still run hears a failure too, where no lost peer stops them.
Two local nodes (c10d); docker and Slurm run the same agent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.procs import env_for_tests, torchjob
from torchjob.trainer.contract import CLOSING, FINISHED, HEARD_FAIL

pytestmark = pytest.mark.integration

# rank 0 finishes; rank 1 fails after it, once rank 0's process has ended (its file written
# as its last act, then its agent may be told in either order)
LATE = """\
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
done = os.path.join(os.environ["TORCHJOB_RUN_DIR"], f"rank0-done-{attempt}")
if os.environ["RANK"] == "0":
    print(f"rank 0 done in attempt {attempt}", flush=True)
    open(done, "w").close()
    sys.exit(0)
deadline = time.monotonic() + 60
while not os.path.exists(done) and time.monotonic() < deadline:
    time.sleep(0.05)
if attempt == 0:
    HOW
print(f"rank 1 done in attempt {attempt}", flush=True)
"""
FAILS = "sys.exit('rank 1 failed while writing its results')"  # a bug: never retried
KILLED = "os.kill(os.getpid(), 9)"  # a lost worker: a restart, were every node still there


@pytest.mark.parametrize("how", ["fails", "killed"])
def test_a_failure_after_a_node_finished_ends_every_node_at_once(tmp_path: Path,
                                                                  how: str) -> None:
    (tmp_path / "late.py").write_text(LATE.replace("HOW", FAILS if how == "fails" else KILLED))
    out = torchjob("run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
                   "late.py", cwd=tmp_path, env=env_for_tests(), timeout=150)
    text = out.stdout + out.stderr
    record = next((tmp_path / "runs" / "late" / ".torchjob").iterdir())
    node0 = (record / "node-0.log").read_text()
    assert "frame #" not in text and "exit code 143" not in text, text[-3000:]
    if how == "killed" and out.returncode == 0:  # the restart was said before node 0 ended
        assert "rank 1 done in attempt 1" in text and "rank 0 done in attempt 1" in text
        assert "this node's workers finished, but" in node0, node0[-3000:]
        return
    assert out.returncode == 1, text[-3000:]
    cause = ("node 1 rank 1 exited with code 1: not retried" if how == "fails" else
             "node 1 rank 1 was killed by SIGKILL")
    assert "another node failed the job: " + cause in node0, node0[-3000:]
    if how == "killed":
        assert "not restarted, as node 0 had already finished" in text, text[-3000:]
    assert FINISHED not in text, text[-3000:]  # the job did not finish
    summary = json.loads((tmp_path / "runs" / "late" / "summary.json").read_text())
    assert summary["state"] == "FAILED" and cause in summary["failure"], summary


# rank 0 fails while rank 1 computes, in no collective: no lost peer would stop it
BUSY = """\
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if os.environ["RANK"] == "0":
    raise ValueError("a bug on rank 0")
print("rank 1 computes", flush=True)
time.sleep(600)
"""


def test_a_failure_stops_a_node_whose_ranks_are_in_no_collective(tmp_path: Path) -> None:
    """The other node's agent, its workers running, heard nothing: the failing node waited
    10 s for it to read the verdict and left, and the job ran on until rank 1's next use of
    the store or a collective timed out (minutes), then "the rendezvous store was lost" (a
    retried exit 200) where the failing node hosted the store. Now it hears the failure
    within a second and stops its workers (torchjob.trainer.round_verdict LOOK_S)."""
    (tmp_path / "busy.py").write_text(BUSY)
    try:
        out = torchjob("run", "--nnodes", "2", "--nproc-per-node", "1", "busy.py",
                       cwd=tmp_path, env=env_for_tests(), timeout=200)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job still ran after 200 s (rank 1 sleeps 600 s):\n{exc.stderr!r}")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    cause = "node 0 rank 0 raised ValueError: a bug on rank 0: not retried"
    record = next((tmp_path / "runs" / "busy" / ".torchjob").iterdir())
    node1 = (record / "node-1.log").read_text()
    assert f"{CLOSING}{HEARD_FAIL}{cause}" in node1, node1[-3000:]
    assert "rank 1 computes" in text and "store was lost" not in text, text[-3000:]
    assert text.rstrip().splitlines()[-1].startswith(CLOSING + cause), text[-3000:]
    summary = json.loads((tmp_path / "runs" / "busy" / "summary.json").read_text())
    assert summary["state"] == "FAILED" and cause in summary["failure"], summary

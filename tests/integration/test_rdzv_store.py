"""An elastic job's own rendezvous store (``trainer.store``), locally and for real: the agent
the endpoint used to point at (node 0) is killed and the other node finishes; the store
itself killed ends the agents with a line that says so, not a hang.

The local launcher's exit code after a lost node is another change's (it reports the lost
node's -9 today), so these check what the survivor does, not the launcher's exit code.
Compose and Slurm: tests/containers/test_compose_run.py and tests/slurm/test_sbatch_run.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, ROOT, alive, cmdline, env_for_tests, last_step, wait_for

pytestmark = pytest.mark.integration
HEADER = re.compile(r"rendezvous 127\.0\.0\.1:(\d+) \(its own store process\) id (\S+),")
SETS = ("nproc_per_node=1", "trainer.args.epochs=30", "trainer.args.batch_size=8",
        "trainer.args.checkpoint_every=10", "trainer.args.log_every=1")


def processes(*words: str) -> list[int]:
    """Pids whose command line holds every word, oldest (lowest start) first."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and all(w in cmdline(int(entry.name)) for w in words):
            found.append(int(entry.name))
    return sorted(found)


def start(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, str, str]:
    """``torchjob run`` of the elastic example (2 agents x 1 worker); (process, its log,
    the store's port, the run id) once it trains at world size 2."""
    log = tmp_path / "run.log"
    argv = [PYTHON, "-m", "jobs", "run", str(ROOT / "jobs" / "examples" / "elastic.yaml"),
            *[a for s in SETS for a in ("--set", s)]]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env_for_tests(), stdout=out,
                                stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    match = wait_for(lambda: HEADER.search(log.read_text()), 60, "the launcher's header")
    wait_for(lambda: last_step(tmp_path / "runs" / "digits-elastic") >= 40
             or proc.poll() is not None, 180, "step 40")
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc, log, match.group(1), match.group(2)


def test_killing_node_0_leaves_the_store_and_the_other_node_finishes(tmp_path: Path) -> None:
    proc, log, port, run_id = start(tmp_path)
    try:
        agents = processes("trainer.agent", run_id)
        store = processes("trainer.store", "--port", port)
        assert len(agents) == 2 and len(store) == 1, (agents, store)
        os.killpg(agents[0], signal.SIGKILL)  # node 0, started first: the agent and its group
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    out = log.read_text()
    summary = json.loads((tmp_path / "runs" / "digits-elastic" / "summary.json").read_text())
    assert summary["world_size"] == 1, out[-3000:]  # the survivor finished alone
    assert "world size changed from 2 to 1" in out, out[-3000:]
    assert "RendezvousConnectionError" not in out, out[-3000:]
    assert not alive(store[0]), "the store outlived the run"


def test_a_lost_store_ends_the_agents_with_a_line_that_says_so(tmp_path: Path) -> None:
    proc, log, port, run_id = start(tmp_path)
    try:
        store = processes("trainer.store", "--port", port)
        assert len(store) == 1, store
        os.kill(store[0], signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    out = log.read_text()
    assert code == 1, out[-3000:]
    assert "torchjob: the rendezvous store ended (exit -9) while nodes run" in out, out[-3000:]
    assert "torchjob: the job failed: the rendezvous store is unreachable" in out, out[-3000:]
    assert processes("trainer.agent", run_id) == []

"""No orphans (trainer.orphans): a SIGKILL of a node's agent takes its workers with it within
seconds, for the built-in trainer (forked from the fork server) and for a user's script."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, alive, descendants, env_for_tests, last_step, wait_for

pytestmark = pytest.mark.integration
GONE_S = 10.0  # the bound; the fork server notices its agent's end at once

SLEEPER = """\
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(600)
"""


def kill_the_agent_alone(agent: subprocess.Popen[bytes], workers: list[int]) -> None:
    """SIGKILL of the agent only; every one of ``workers`` must be gone within GONE_S."""
    assert workers, "no worker found under the agent"
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    try:
        wait_for(lambda: not any(alive(pid) for pid in workers), GONE_S,
                 f"the workers {workers} to end with their agent")
    finally:
        for pid in workers:  # whatever outlived the test must not outlive the suite
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_trainers_workers_die_with_their_agent(tmp_path: Path) -> None:
    agent = subprocess.Popen(
        [PYTHON, "-m", "torchjob.trainer.agent", "--standalone", "--nproc-per-node", "2", "-m",
         "torchjob.trainer", "--run-dir", str(tmp_path), "--epochs", "50", "--log-every", "1",
         "--progress", "lines"], env=env_for_tests(), stderr=subprocess.DEVNULL,
        start_new_session=True)
    wait_for(lambda: last_step(tmp_path) >= 2 or agent.poll() is not None, 120, "step 2")
    assert agent.poll() is None, f"the agent ended with {agent.returncode}"
    kill_the_agent_alone(agent, descendants(agent.pid))


def test_a_scripts_workers_die_with_their_agent(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    agent = subprocess.Popen(
        [PYTHON, "-m", "torchjob.trainer.agent", "--standalone", "--nproc-per-node", "2",
         str(script), str(tmp_path)], env=env_for_tests(), stderr=subprocess.DEVNULL,
        start_new_session=True)
    wait_for(lambda: len(list(tmp_path.glob("pid-*"))) == 2 or agent.poll() is not None, 120,
             "both scripts to write their pids")
    assert agent.poll() is None, f"the agent ended with {agent.returncode}"
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    kill_the_agent_alone(agent, sorted(set(pids) | set(descendants(agent.pid))))

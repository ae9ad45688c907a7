"""A stop that reaches a worker waiting in init_process_group for a peer the stop ended: the
worker's own handler (a script that checkpoints on SIGTERM, or the built-in trainer) would
hear it only once init returns, which it never does, and torch's shutdown killed it after its
30 s. The agent kills it once its heartbeats, after the stop, still find it there
(trainer.hang.Watchdog.ending_stuck_in_init)."""

from __future__ import annotations

import subprocess
import signal
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests, wait_for

SCRIPT = """\
import os, signal, sys, time
import torch.distributed as dist
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))  # it would checkpoint on a stop
if os.environ["RANK"] == "0":  # never reaches init: the stop ends it
    print("rank 0 waits", flush=True)
    while not stopped:
        time.sleep(0.05)
    sys.exit(143)
print("rank 1 enters init", flush=True)
dist.init_process_group("gloo")
print("rank 1 left init", flush=True)
"""


@pytest.mark.integration
def test_a_stop_ends_a_worker_that_waits_in_init_for_a_peer_the_stop_ended(
        tmp_path: Path) -> None:
    script, log = tmp_path / "script.py", tmp_path / "agent.log"
    script.write_text(SCRIPT)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [PYTHON, "-m", "torchjob.trainer.agent", "--hang-timeout", "60", "--standalone",
             "--nproc-per-node", "2", "--max-restarts", "0", str(script)],
            env=env_for_tests(), stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        wait_for(lambda: "rank 1 enters init" in log.read_text() and
                 "rank 0 waits" in log.read_text() or proc.poll() is not None, 120,
                 "rank 1 in init, rank 0 outside it")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 143, text[-3000:]
    assert "Unable to shutdown process" not in text, text[-3000:]  # torch's SIGKILL at 30 s
    assert "rank 1 left init" not in text, text[-3000:]

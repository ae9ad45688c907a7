"""One live run per run directory (torchjob.trainer.runlock): a second live run is refused with its
owner named, the nodes of one run share the lock, and a killed run's lock is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.procs import PYTHON, descendants, env_for_tests, last_step, wait_for
from torchjob.trainer.contract import CLOSING_RE
from torchjob.trainer.runlock import HEARTBEAT_S, LOCK, STALE_S, RunDirBusy, RunLock, clear


def write_lock(run_dir: Path, age: float, **record: object) -> Path:
    path = run_dir / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": "old", "host": socket.gethostname(), "pid": 1,
                                "pid_start": "0", "pid_ns": "", "since": 0, **record}))
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_run_takes_the_lock_and_gives_it_back(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, "job-1")
    lock.acquire()
    record = json.loads((tmp_path / LOCK).read_text())
    assert record["run_id"] == "job-1" and record["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK).exists()


def test_the_nodes_of_one_run_share_the_lock(tmp_path: Path) -> None:
    first, second = RunLock(tmp_path, "job-1"), RunLock(tmp_path, "job-1")
    first.acquire()
    second.acquire()  # another node, a restarted pod, a requeued Slurm job: the same run
    first.release()
    second.release()


def test_a_live_run_of_another_id_refuses_naming_its_owner(tmp_path: Path) -> None:
    owner = RunLock(tmp_path, "job-1")
    owner.acquire()
    with pytest.raises(RunDirBusy) as refused:
        RunLock(tmp_path, "job-2").acquire()
    text = str(refused.value)
    assert f"run job-1 (host {socket.gethostname()}, pid {os.getpid()}" in text
    assert str(tmp_path) in text and "run_dir" in text
    owner.release()


def test_a_launcher_clears_its_own_runs_lock_only(tmp_path: Path) -> None:
    """A run whose agents were killed in containers (another PID namespace: nobody can tell
    they are gone before STALE_S): its launcher, which saw them all end, clears the lock."""
    path = write_lock(tmp_path, 1, host="node0", pid=1, run_id="job-1")
    assert not clear(tmp_path, "job-2") and path.exists()
    assert clear(tmp_path, "job-1") and not path.exists()
    assert not clear(tmp_path, "job-1")  # none left: nothing to do
    lock = RunLock(tmp_path, "job-2")
    lock.acquire()
    lock.release()


def test_a_lock_from_another_host_is_stale_only_when_not_renewed(tmp_path: Path) -> None:
    write_lock(tmp_path, STALE_S / 2, host="elsewhere", pid=os.getpid())
    with pytest.raises(RunDirBusy):
        RunLock(tmp_path, "new").acquire()
    write_lock(tmp_path, STALE_S + 1, host="elsewhere", pid=os.getpid())
    said: list[str] = []
    lock = RunLock(tmp_path, "new", say=said.append)
    lock.acquire()
    assert "not renewed for" in said[0] and "host elsewhere" in said[0]
    assert json.loads((tmp_path / LOCK).read_text())["run_id"] == "new"
    lock.release()


def test_a_lock_whose_process_is_gone_is_stale_after_two_beats(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    ns = os.readlink("/proc/self/ns/pid")
    write_lock(tmp_path, HEARTBEAT_S / 2, pid=proc.pid, pid_ns=ns)
    with pytest.raises(RunDirBusy):  # another agent of that run may still renew it
        RunLock(tmp_path, "new").acquire()
    write_lock(tmp_path, 2 * HEARTBEAT_S, pid=proc.pid, pid_ns=ns)
    said: list[str] = []
    RunLock(tmp_path, "new", say=said.append).acquire()
    assert "its process is gone" in said[0]


def agent(run_dir: Path, *args: str) -> list[str]:
    return [PYTHON, "-m", "torchjob.trainer.agent", "--run-dir", str(run_dir), "--standalone",
            "--nproc-per-node", "1", "--max-restarts", "0", "-m", "torchjob.trainer",
            "--run-dir", str(run_dir), "--progress", "lines", *args]


@pytest.mark.integration
def test_a_second_run_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path: Path) -> None:
    first = subprocess.Popen(agent(tmp_path, "--epochs", "50", "--log-every", "1"),
                             env=env_for_tests(), stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        wait_for(lambda: last_step(tmp_path) >= 2 or first.poll() is not None, 120,
                 "the first run's step 2")
        assert first.poll() is None, f"the first run ended with {first.returncode}"
        second = subprocess.run(agent(tmp_path, "--epochs", "1"), env=env_for_tests(),
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        last = second.stderr.strip().splitlines()[-1]
        match = CLOSING_RE.match(last)
        assert match and match["code"] == "2", second.stderr[-2000:]
        assert f"host {socket.gethostname()}, pid {first.pid}" in last, last
    finally:
        for pid in [*descendants(first.pid), first.pid]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        first.wait()
    lock = tmp_path / LOCK
    assert lock.exists(), "a SIGKILLed agent cannot remove its lock"
    wait_for(lambda: time.time() - lock.stat().st_mtime >= 2 * HEARTBEAT_S, 3 * HEARTBEAT_S,
             "the killed run's lock to go two beats without renewal")
    third = subprocess.run(agent(tmp_path, "--epochs", "1", "--checkpoint-dir",
                                 str(tmp_path / "fresh")),
                           env=env_for_tests(), capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]
    assert "from run standalone:" in third.stderr and "its process is gone" in third.stderr
    assert not lock.exists()

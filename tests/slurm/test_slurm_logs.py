"""Logs per attempt and per rank, the first failing rank, and following growing files (synthetic
files in the exact format the batch script writes; the jobs that write real ones are in
test_sbatch_run.py and test_slurm_backend.py)."""

from __future__ import annotations

from pathlib import Path

from torchjob.slurm.logs import Follower, first_failures, job_logs
from torchjob.trainer.contract import log_prefix

ROOT_CAUSE = """\
============================================================
trainer FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : {time}
  host      : node
  rank      : {rank} (local_rank: 1)
  exitcode  : 1 (pid: 123)
  error_file: <N/A>
============================================================"""
JOB = log_prefix("-", "-", 0)  # "[node - rank - attempt 0] ": the batch shell's lines


def test_logs_per_attempt_rank_and_first_failure(tmp_path: Path) -> None:
    (tmp_path / "slurm-7.out").write_text(
        "torchjob: j job 7 attempt 0 on 2 node(s), rendezvous n1:12007\n"
        "[node 0 rank 0 attempt 0] training\n"
        "torchjob: stopped (step exit 143); requeueing, attempt 1 of 3 requeues\n"
        "torchjob: j job 7 attempt 1 on 2 node(s), rendezvous n1:12007\n"
        "[node 0 rank 0 attempt 1] resumed\n")
    (tmp_path / "slurm-7.err").write_text(
        "torchjob: j job 7 attempt 0 on 2 node(s), rendezvous n1:12007\n"
        "[node 1 rank 2 attempt 0] stopped by SIGTERM\n"
        "torchjob: j job 7 attempt 1 on 2 node(s), rendezvous n1:12007\n"
        "[node 1 rank 3 attempt 1] Traceback (most recent call last):\n"
        "[node 1 rank 3 attempt 1] RuntimeError: boom\n"
        "[node 0 rank 1 attempt 1] Traceback (most recent call last):\n"
        + ROOT_CAUSE.format(time="2026-11-22_10:00:05", rank=3) + "\n"
        + ROOT_CAUSE.format(time="2026-11-22_10:00:04", rank=1) + "\n"
        "srun: error: n1: task 0: Exited with exit code 1\n")
    logs = job_logs(tmp_path, "7")
    assert logs.attempts() == [0, 1]
    assert logs.lines[(0, 0)] == ["training"] and logs.lines[(0, 2)] == ["stopped by SIGTERM"]
    assert logs.lines[(1, 3)] == ["Traceback (most recent call last):", "RuntimeError: boom"]
    assert logs.lines[(0, "-")][0].endswith("attempt 0 on 2 node(s), rendezvous n1:12007")
    assert "srun: error: n1: task 0: Exited with exit code 1" in logs.lines[(1, "-")]
    assert logs.first_failing == {1: 1}  # torchrun saw rank 1 fail first (on the other node)
    shown = list(logs.formatted())
    assert shown[:3] == ["[node 0 rank 0 attempt 0] training",
                         "[node 1 rank 2 attempt 0] stopped by SIGTERM",
                         f"{JOB}torchjob: j job 7 attempt 0 on 2 node(s), rendezvous n1:12007"]
    assert "[node 1 rank 3 attempt 1] RuntimeError: boom" in shown
    assert list(first_failures(logs)) == [
        "torchjob: attempt 1: first failing rank: 1 (node 0); full log: "
        f"{tmp_path / 'slurm-7.out'} and {tmp_path / 'slurm-7.err'}"]


def test_the_agents_closing_line_names_the_first_failure(tmp_path: Path) -> None:
    (tmp_path / "slurm-8.out").write_text("")
    (tmp_path / "slurm-8.err").write_text(
        "torchjob: j job 8 attempt 0 on 2 node(s), rendezvous n1:12007\n"
        "[node 0 rank 1 attempt 0] RuntimeError: [gloo/transport/tcp] Connection closed\n"
        "[node 1 rank 3 attempt 0] ValueError: boom\n"
        "torchjob: the job failed: stopping: node 1 rank 3 raised ValueError: boom: not "
        "retried (...) (attempt 0, exit 1)\n"
        "torchjob: the job failed: node 1 rank 3 raised ValueError: boom: not retried (...) "
        "(attempt 0, exit 1)\n")
    assert list(first_failures(job_logs(tmp_path, "8"))) == [
        "torchjob: attempt 0: first failing rank: 3 (node 1): raised ValueError: boom: not "
        f"retried (...); full log: {tmp_path / 'slurm-8.out'} and {tmp_path / 'slurm-8.err'}"]


def test_follow_reads_what_was_appended_and_each_line_once(tmp_path: Path) -> None:
    out = tmp_path / "slurm-8_1.out"
    follower = Follower(tmp_path, ["8_0", "8_1"])
    assert list(follower.poll()) == []  # nothing written yet (a pending job)
    out.write_text("torchjob: j job 8_1 attempt 0 on 1 node(s), rendezvous n1:12009\n"
                   "[node 0 rank 0 attempt 0] step 1\n[node 0 rank 0 attempt 0] ste")
    assert list(follower.poll()) == [
        f"[8_1] {JOB}torchjob: j job 8_1 attempt 0 on 1 node(s), rendezvous n1:12009",
        "[8_1] [node 0 rank 0 attempt 0] step 1"]
    with out.open("a") as f:
        f.write("p 2\ntorchjob: j job 8_1 attempt 1 on 1 node(s), rendezvous n1:12009\nlast")
    (tmp_path / "slurm-8_1.err").write_text(
        "torchjob: j job 8_1 attempt 1 on 1 node(s), rendezvous n1:12009\nwarning\n")
    assert list(follower.poll(final=True)) == [
        "[8_1] [node 0 rank 0 attempt 0] step 2",
        f"[8_1] {log_prefix('-', '-', 1)}torchjob: j job 8_1 attempt 1 on 1 node(s), "
        "rendezvous n1:12009",
        f"[8_1] {log_prefix('-', '-', 1)}last",
        f"[8_1] {log_prefix('-', '-', 1)}warning"]
    assert list(follower.poll(final=True)) == []

"""Logs per attempt and per rank, and the first failing rank, from the files each path writes
(synthetic files in the exact formats; the jobs that write real ones are in test_submitit.py and
test_sbatch_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.cli import main
from slurm.slurm_logs import job_logs

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


def test_sbatch_logs_per_attempt_rank_and_first_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "slurm-7.out").write_text(
        "torchjob: j job 7 attempt 0 on 2 node(s), rendezvous n1:12007\n"
        "[attempt 0 rank 0]: training\n"
        "torchjob: stopped (step exit 143); requeueing, attempt 1 of 3 requeues\n"
        "torchjob: j job 7 attempt 1 on 2 node(s), rendezvous n1:12007\n"
        "[attempt 1 rank 0]: resumed\n")
    (tmp_path / "slurm-7.err").write_text(
        "torchjob: j job 7 attempt 0 on 2 node(s), rendezvous n1:12007\n"
        "[attempt 0 rank 2]: stopped by SIGTERM\n"
        "torchjob: j job 7 attempt 1 on 2 node(s), rendezvous n1:12007\n"
        "[attempt 1 rank 3]: Traceback (most recent call last):\n"
        "[attempt 1 rank 3]: RuntimeError: boom\n"
        "[attempt 1 rank 1]: Traceback (most recent call last):\n"
        + ROOT_CAUSE.format(time="2026-11-22_10:00:05", rank=3) + "\n"
        + ROOT_CAUSE.format(time="2026-11-22_10:00:04", rank=1) + "\n"
        "srun: error: n1: task 0: Exited with exit code 1\n")
    logs = job_logs(tmp_path, "7")
    assert logs.attempts() == [0, 1]
    assert logs.lines[(0, 0)] == ["training"] and logs.lines[(0, 2)] == ["stopped by SIGTERM"]
    assert logs.lines[(1, 3)] == ["Traceback (most recent call last):", "RuntimeError: boom"]
    assert logs.lines[(0, "job")][0].endswith("attempt 0 on 2 node(s), rendezvous n1:12007")
    assert "srun: error: n1: task 0: Exited with exit code 1" in logs.lines[(1, "job")]
    assert logs.first_failing == {1: 1}  # torchrun saw rank 1 fail first (on the other node)
    shown = list(logs.formatted())
    assert shown[:3] == ["[attempt 0 rank 0] training", "[attempt 0 rank 2] stopped by SIGTERM",
                         "[attempt 0 job] torchjob: j job 7 attempt 0 on 2 node(s), "
                         "rendezvous n1:12007"]
    assert main(["logs", "--to", "slurm", "7", "--log-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "[attempt 1 rank 3] RuntimeError: boom" in out
    assert err == "attempt 1: first failing rank: 1\n"


def test_submitit_logs_split_appended_files_into_attempts(tmp_path: Path) -> None:
    def start(rank: int, attempt: int, when: str) -> str:
        return (f"submitit INFO ({when}) - Starting with JobEnvironment(job_id=9, "
                f"global_rank={rank})\ntorchjob: job 9 attempt {attempt} rank {rank}\n")

    for rank, fail in ((0, "2026-11-22 10:00:03,500"), (1, "2026-11-22 10:00:03,100"), (2, "")):
        err = start(rank, 0, "2026-11-22 10:00:00,000") + "stopped by SIGUSR2\n" \
            + start(rank, 1, "2026-11-22 10:00:02,000") + "resumed from step_00000040\n"
        if fail:
            err += f"submitit ERROR ({fail}) - Submitted job triggered an exception\n" \
                   "Traceback (most recent call last):\n"
        (tmp_path / f"9_{rank}_log.err").write_text(err)
        (tmp_path / f"9_{rank}_log.out").write_text(
            f"torchjob: job 9 attempt 0 rank {rank}\nout0\ntorchjob: job 9 attempt 1 rank "
            f"{rank}\nout1\n")
    logs = job_logs(tmp_path, "9")
    assert logs.attempts() == [0, 1]
    assert logs.lines[(0, 2)][1:] == ["torchjob: job 9 attempt 0 rank 2", "stopped by SIGUSR2",
                                      "torchjob: job 9 attempt 0 rank 2", "out0"]
    assert logs.lines[(1, 2)][0].startswith("submitit INFO (2026-11-22 10:00:02,000)")
    assert logs.lines[(1, 2)][-1] == "out1"
    assert logs.first_failing == {1: 1}  # rank 1's exception was logged first

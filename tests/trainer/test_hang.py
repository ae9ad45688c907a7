"""The hang watchdog's pieces (trainer.hang, trainer.progress) and the straggler report
(torchjob.trainer.stragglers), without processes to hang: the end-to-end proof is the conformance
matrix's "hang" row (a real SIGSTOP on local, docker and Slurm)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchjob.trainer import progress, stragglers
from torchjob.trainer.agent import hang_timeout
from torchjob.trainer.hang import (BEAT_LOST_S, Seen, Watchdog, check, kill_stopped, process_state,
                                   read_record, stack_of)
from torchjob.trainer.progress import NO_STEP

T = 20.0


def seen(rank: int, *, step: int = 7, step_at: float = 0.0, beat_at: float = 0.0,
         state: str = "S", beats: int = 3) -> Seen:
    w = Seen(rank, rank, 1000 + rank, 0.0, step=step, beats=beats, state=state)
    w.step_at, w.beat_at = step_at, beat_at
    return w


def test_a_group_that_progresses_is_not_a_hang() -> None:
    group = [seen(0, step_at=5.0, beat_at=24.0), seen(1, step_at=5.0, beat_at=24.0)]
    assert check(group, 24.0, T, nodes=1, overdue_since=24.0, others_first_s=10) is None


def test_the_stopped_rank_is_named_not_its_peer_that_waits_for_it() -> None:
    # both last finished step 7 at t=0; rank 1 stopped at once, rank 0 beats on in the
    # all-reduce that waits for it
    group = [seen(0, beat_at=20.5), seen(1, beat_at=0.2, state="T")]
    hang = check(group, 21.0, T, nodes=2, overdue_since=21.0, others_first_s=10)
    assert hang is not None and hang.act  # a node with a silent rank acts at once
    assert [w.rank for w in hang.stuck] == [1]
    assert "rank 1 (last step 7, its process is stopped (state T)) stuck" in hang.why
    # silent without a stopped state (frozen, holding the GIL): named by the heartbeat
    group = [seen(0, beat_at=20.5), seen(1, beat_at=21.0 - BEAT_LOST_S - 1)]
    hang = check(group, 21.0, T, nodes=1, overdue_since=21.0, others_first_s=10)
    assert hang is not None and [w.rank for w in hang.stuck] == [1]
    assert "no heartbeat for 6 s" in hang.why


def test_a_node_whose_ranks_only_wait_leaves_the_first_move_to_the_others() -> None:
    group = [seen(2, beat_at=20.5), seen(3, beat_at=20.5)]
    hang = check(group, 21.0, T, nodes=2, overdue_since=21.0, others_first_s=10)
    assert hang is not None and not hang.act and [w.rank for w in hang.stuck] == [2, 3]
    assert "no rank of this node stopped" in hang.why
    later = check(group, 31.0, T, nodes=2, overdue_since=21.0, others_first_s=10)
    assert later is not None and later.act  # nobody did: a deadlock of live ranks
    alone = check(group, 21.0, T, nodes=1, overdue_since=21.0, others_first_s=10)
    assert alone is not None and alone.act


def test_the_rank_behind_is_named_when_none_is_silent() -> None:
    group = [seen(0, step=8, beat_at=20.5), seen(1, step=7, beat_at=20.5)]
    hang = check(group, 21.0, T, nodes=1, overdue_since=21.0, others_first_s=10)
    assert hang is not None and [w.rank for w in hang.stuck] == [1]
    assert "behind the others (steps [7, 8])" in hang.why


def test_before_its_first_step_a_rank_is_judged_by_its_heartbeat_alone() -> None:
    # a long start-up (data, compilation): no step for 100 s, but the process runs
    starting = [seen(0, step=NO_STEP, beat_at=99.5)]
    assert check(starting, 100.0, T, nodes=1, overdue_since=100.0, others_first_s=10) is None
    gone = [seen(0, step=NO_STEP, beat_at=50.0)]
    assert check(gone, 100.0, T, nodes=1, overdue_since=100.0, others_first_s=10) is not None


def test_exited_and_unreporting_workers_are_not_judged() -> None:
    group = [seen(0, state="Z"), seen(1, state=""), seen(2, beats=-1)]
    assert check(group, 100.0, T, nodes=1, overdue_since=100.0, others_first_s=10) is None


def test_progress_reports_reach_the_watchdog(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's ``progress.step`` and heartbeat, read back by the agent's side (one file
    per local rank, the pid checked so that a file of the last group is not read)."""
    monkeypatch.setenv("TORCHJOB_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(progress, "_reporter", None)
    now = [0.0]
    dog = Watchdog(tmp_path, T, others_first_s=10, say=print, clock=lambda: now[0])
    dog.reset([(0, 4, os.getpid())])
    progress.step()
    progress.step()
    assert read_record(tmp_path / "0") == (2, 0, os.getpid())
    now[0] = 1.5
    dog.observe()
    assert (dog.seen[0].step, dog.seen[0].step_at, dog.seen[0].beats) == (2, 1.5, 0)
    progress.step(40)
    now[0] = 2.0  # read at most once a second
    dog.observe()
    assert dog.seen[0].step == 2
    now[0] = 30.0
    dog.observe()
    assert dog.seen[0].step == 40 and dog.poll(nodes=1) is None  # read, not overdue
    dog.reset([(0, 4, os.getpid() + 1)])  # another process's file: not this worker's
    now[0] = 32.0
    dog.observe()
    assert dog.seen[0].beats == -1


def test_progress_does_nothing_outside_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHJOB_PROGRESS_DIR", raising=False)
    monkeypatch.setattr(progress, "_reporter", None)
    progress.step(3)
    assert progress._reporter is None


def test_a_stopped_process_gets_a_stack_and_is_killed() -> None:
    """py-spy reads a stopped process (faulthandler could not run in it); SIGKILL ends it
    where torch's SIGTERM would wait for a SIGCONT."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time\ndef waiting_here():\n"
                             "    print('up', flush=True)\n    time.sleep(600)\nwaiting_here()"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        os.kill(proc.pid, 19)  # SIGSTOP
        for _ in range(100):
            if process_state(proc.pid) == "T":
                break
            subprocess.run(["true"])  # yield a moment without sleeping on a clock
        assert process_state(proc.pid) == "T"
        text = stack_of(proc.pid)
        assert "waiting_here" in text or "py-spy is not installed" in text, text
        assert kill_stopped([proc.pid]) == [proc.pid]
        assert proc.wait(timeout=30) == -9
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("raw, expected", [("20", 20.0), ("0", 0.0), ("5", 5.0)])
def test_hang_timeout_option(raw: str, expected: float) -> None:
    assert hang_timeout({"TORCHJOB_HANG_TIMEOUT": raw}) == expected


@pytest.mark.parametrize("raw", ["1", "-3", "x", "nan", "inf"])
def test_a_bad_hang_timeout_says_what_is_accepted(raw: str) -> None:
    with pytest.raises(ValueError, match="0 \\(no watchdog\\) or at least 5"):
        hang_timeout({"TORCHJOB_HANG_TIMEOUT": raw})


def test_percentiles_and_the_straggler_named() -> None:
    assert stragglers.percentiles([0.010] * 9 + [0.100]) == {
        "steps": 10, "p50_ms": 10.0, "p90_ms": 10.0, "max_ms": 100.0}
    ranks = [stragglers.percentiles([s] * 5) for s in (0.010, 0.011, 0.010, 0.013)]
    work = stragglers.report(ranks)
    assert work["median_p50_ms"] == 10.5 and work["stragglers"] == [3]  # 13 > 1.2 * 10.5
    assert stragglers.line(work).startswith("stragglers: rank 3 (p50 13.0 ms, +24%)")
    even = stragglers.report(ranks[:3])
    assert even["stragglers"] == [] and stragglers.line(even).startswith("stragglers: none")
    assert stragglers.report([stragglers.percentiles([])])["stragglers"] == []

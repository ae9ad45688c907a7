"""The hang watchdog's pieces (trainer.hang, trainer.culprit, trainer.progress, trainer.frames)
and the straggler report (torchjob.trainer.stragglers), without processes to hang: the
end-to-end proofs are tests/integration/test_hang_culprit.py (every hang shape, the culprit
drawn at random) and the conformance matrix's "hang" row."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import torch
from torch.distributed import HashStore

from torchjob.trainer import frames, progress, stragglers
from torchjob.trainer.agent import hang_timeout
from torchjob.trainer.culprit import RankView, find, hung
from torchjob.trainer.contract import EXIT_RETRY
from torchjob.trainer.failures import Failure, judge
from torchjob.trainer.hang import INIT_WAIT_S, WAITING_KEY, Seen, Watchdog, read_record
from torchjob.trainer.progress import Record
from torchjob.trainer.stacks import kill_stopped, process_state, stack_of
from tests.procs import env_for_tests, free_port

T = 20.0


def view(rank: int, *, node: int = 0, step: int = -1, seq: int = 9, idle: float = 21.0,
         coll: bool = True, state: str = "S", silent: bool = False, frame: str = "",
         counted: bool = True) -> RankView:
    return RankView(rank, node, step, seq, counted, coll, state, frame, idle,
                    30.0 if silent else 0.5, silent)


def test_a_group_that_progresses_is_not_a_hang() -> None:
    assert not hung([view(0, idle=3.0), view(1, idle=2.0)], T)
    # every rank in its own code at one point, none waiting (a long evaluation of a script
    # that reports no steps): no hang; a rank that reports steps is held to them
    assert not hung([view(0, coll=False), view(1, coll=False)], T)
    assert hung([view(0, coll=False, step=7), view(1, coll=False, step=7)], T)


@pytest.mark.parametrize("state, wchan, how", [
    ("R", "", "running"), ("S", "hrtimer_nanosleep", "sleeping in hrtimer_nanosleep"),
    ("S", "pipe_read", "sleeping in pipe_read"), ("D", "", "in uninterruptible I/O")])
def test_the_rank_behind_in_collectives_is_named_not_those_that_wait(state: str, wchan: str,
                                                                      how: str) -> None:
    """A busy loop, a sleep, a read: the culprit is one collective behind, in its own code;
    the others wait inside the collective it has not reached."""
    culprit = replace(view(2, node=1, seq=8, coll=False, state=state, frame="train.py:9 in f"),
                      wchan=wchan)
    group = [view(0), view(1), culprit, view(3, node=1)]
    assert hung(group, T)
    found = find(group, T)
    assert [v.rank for v in found.culprits] == [2] and [v.rank for v in found.waiting] == [0, 1, 3]
    assert found.why.startswith(f"rank 2 on node 1 ({how}; at train.py:9 in f) 1 collective(s) "
                                "behind the others (sequence 8, the others 9)")
    assert found.why.endswith("waiting for it: rank(s) 0, 1, 3")


def test_the_stopped_or_silent_rank_is_named_first() -> None:
    group = [view(0), view(1, state="T", silent=True, seq=8, frame="a.py:1 in g")]
    found = find(group, T)
    assert [v.rank for v in found.culprits] == [1]
    assert "rank 1 on node 0 (its process is stopped (state T); last seen at a.py:1 in g) " \
        "stuck" in found.why
    frozen = [view(0), view(1, state="R", silent=True)]
    assert "no heartbeat for 30 s" in find(frozen, T).why


def test_outside_a_collective_and_behind_in_steps() -> None:
    same_seq = [view(0), view(1, coll=False, frame="x.py:3 in h")]
    assert [v.rank for v in find(same_seq, T).culprits] == [1]
    assert "outside any collective while the others wait in one" in find(same_seq, T).why
    steps = [view(0, step=8, coll=False), view(1, step=7, coll=False)]
    assert [v.rank for v in find(steps, T).culprits] == [1]
    assert "behind the others (steps [7, 8])" in find(steps, T).why


def test_a_rank_whose_exit_waits_for_its_own_thread_is_named_and_not_retried() -> None:
    """Its script ended, but a thread that is not a daemon (an uploader never joined) holds
    its exit: alone and outside any collective, it is a hang once that lasts the timeout
    (timed from the first read that saw it exiting), and its failure is not retried."""
    w = Seen(0, 1, os.getpid(), 0.0)
    w.state = "S"
    w.read(Record(beats=1, pid=w.pid, seq=5), 1.0)
    w.read(Record(beats=50, pid=w.pid, seq=5, exiting="its thread 'uploader'",
                  frame="up.py:4 in upload"), 50.0)
    w.read(Record(beats=60, pid=w.pid, seq=5, exiting="its thread 'uploader'",
                  frame="up.py:4 in upload"), 60.0)
    assert w.view(60.0, 0).idle_s == 10.0 and not hung([w.view(60.0, 0)], T)
    w.read(Record(beats=70, pid=w.pid, seq=5, exiting="its thread 'uploader'",
                  frame="up.py:4 in upload"), 70.0)
    held = w.view(71.0, 0)
    assert hung([held], T) and not hung([replace(held, exiting="")], T)
    found = find([view(0, coll=False), held], T)
    assert [v.rank for v in found.culprits] == [1], found.why
    assert "at up.py:4 in upload) its script ended, but its exit waits for its thread " \
        "'uploader' (not a daemon)" in found.why
    failure = Failure(0, 1, -9, "", 0.0, hung=f"no step yet; {found.reason}")
    verdict = judge([failure], retry_on_error=False)
    assert verdict.restart is False and "not retried (a restart would run the script " \
        "again" in verdict.why, verdict
    assert Record.decode(Record(exiting="its thread 'x'").encode()) == Record(
        exiting="its thread 'x'")


def test_a_deadlock_names_no_culprit() -> None:
    found = find([view(0), view(1)], T)
    assert found.culprits == () and "all wait (a deadlock, or a lost link)" in found.why


def test_before_its_first_progress_a_rank_is_judged_by_its_heartbeat_alone() -> None:
    """Start-up (imports, data, compilation) is no hang while the process beats: a rank's
    clock starts at its first step, optimizer step or finished collective. Its wait inside a
    collective is timed from the first read that saw it there."""
    w = Seen(0, 0, os.getpid(), 0.0)
    w.state = "S"
    w.read(Record(beats=1, pid=w.pid, seq=1, in_collective=True), 0.5)  # in its first one
    w.read(Record(beats=99, pid=w.pid, seq=1, in_collective=True), 99.5)
    assert not w.counted and w.view(100.0, 0).idle_s == 0.5
    assert w.view(100.0, 0).waited_s == 99.5
    w.read(Record(beats=100, pid=w.pid, seq=2, in_collective=True), 100.0)
    assert w.counted and w.view(130.0, 0).idle_s == 30.0 and w.view(130.0, 0).waited_s == 30.0
    w.read(Record(beats=101, pid=w.pid, seq=2, in_collective=False), 131.0)
    assert w.view(140.0, 0).waited_s == 0.0


def test_in_start_up_a_rank_waited_for_that_long_is_a_hang_but_shared_work_is_not() -> None:
    """Before any rank progressed: a rank inside its first collective for the timeout while
    another has not entered it (outside any, or behind in sequence) is a hang, and that other
    is named; every rank inside torch.distributed that long (a long checkpoint load, or a
    deadlock that the collective's own timeout ends) is not, nor any long start-up outside."""
    def start(rank: int, seq: int, coll: bool, waited: float) -> RankView:
        return replace(view(rank, seq=seq, coll=coll, idle=0.5, counted=False,
                            frame="train.py:4 in load"), waited_s=waited)

    waiting = start(0, 1, True, T)
    assert hung([waiting, start(1, 0, False, 0.0)], T)
    assert not hung([replace(waiting, waited_s=T - 1), start(1, 0, False, 0.0)], T)
    assert [v.rank for v in find([waiting, start(1, 0, False, 0.0)], T).culprits] == [1]
    before_init = [start(0, -1, True, T), start(1, -1, False, 0.0)]  # 0 waits in init
    assert hung(before_init, T)
    assert "outside any collective while the others wait in one" in find(before_init, T).why
    assert not hung([start(0, 1, True, T), start(1, 1, True, T)], T)
    assert not hung([start(0, 0, False, 0.0), start(1, 0, False, 0.0)], T)


def test_a_rank_that_lost_its_peers_after_a_wait_in_init_waited_for_one_that_never_came(
        tmp_path: Path) -> None:
    """Its peers went away (the store's host timed out on another node) while it waited in
    init_process_group: as a rank that timed out there, for at least INIT_WAIT_S, though its
    last heartbeat came from its way out (its error file being written: it was seen nowhere
    near init then, as in CI); one that had its process group, or waited less, or failed in
    its own code is not."""
    dog = Watchdog(tmp_path, T, others_first_s=1.0, say=print, clock=lambda: 100.0)
    dog.seen = [Seen(local, 10 + local, pid=0, started=90.0) for local in range(3)]
    waits = {0: INIT_WAIT_S + 1, 1: INIT_WAIT_S / 2, 2: 10.0}
    for now in (90.0 + 0.5 * read for read in range(19)):  # a read every 0.5 s, to 99
        for w in dog.seen:
            inside = now >= 99.0 - waits[w.local_rank] and now < 99.0
            seq = 3 if w.local_rank == 2 and now > 90.0 else -1
            w.read(Record(seq=seq, in_collective=inside, beats=int(now)), now)
    lost = {local: SimpleNamespace(exitcode=EXIT_RETRY) for local in range(3)}
    assert dog.seen[0].record is not None and not dog.seen[0].record.in_collective
    assert dog.left_init(lost) == {10: INIT_WAIT_S + 0.5}
    assert dog.left_init({**lost, 0: SimpleNamespace(exitcode=1)}) == {}


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
    record = read_record(tmp_path / "0")
    assert record is not None and (record.step, record.pid) == (2, os.getpid())
    now[0] = 1.5
    dog.observe()
    assert (dog.seen[0].step, dog.seen[0].step_at) == (2, 1.5)
    progress.step(40)
    now[0] = 2.0  # read at most once a second
    dog.observe()
    assert dog.seen[0].step == 2
    now[0] = 30.0
    dog.observe()
    assert dog.seen[0].step == 40 and dog.poll() is None  # read, not overdue
    dog.reset([(0, 4, os.getpid() + 1)])  # another process's file: not this worker's
    now[0] = 32.0
    dog.observe()
    assert dog.seen[0].record is None


def test_a_half_written_record_is_not_read() -> None:
    data = Record(step=3, beats=2, pid=7, seq=5, frame="t.py:1 in f").encode()
    assert Record.decode(data) == Record(3, 2, 7, 5, 0, False, "t.py:1 in f")
    other = Record(step=4, beats=3, pid=7, seq=6, frame="t.py:2 in g").encode()
    assert Record.decode(data[:40] + other[40:]) is None


def test_progress_does_nothing_outside_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHJOB_PROGRESS_DIR", raising=False)
    monkeypatch.setattr(progress, "_reporter", None)
    progress.step(3)
    assert progress._reporter is None


UNMODIFIED = """
import os, sys, time
from torchjob.trainer import progress
progress.start()
import torch
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
p = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([p], lr=0.1)
for _ in range(3):
    dist.all_reduce(p.data)
    opt.step()
def waiting_here():
    beats = progress._reporter.record.beats
    while progress._reporter.record.beats < beats + 2:
        time.sleep(0.05)
waiting_here()
print(open(os.path.join(os.environ["TORCHJOB_PROGRESS_DIR"], "0"), "rb").read().decode())
"""


def test_a_script_that_calls_nothing_is_seen(tmp_path: Path) -> None:
    """Its collectives and optimizer steps counted, its main thread's place in its own code
    (the optimizer's hook set at torch's import, in the importing thread)."""
    script = tmp_path / "unmodified.py"
    script.write_text(UNMODIFIED)
    done = subprocess.run([sys.executable, str(script), str(free_port())], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env_for_tests(
                              TORCHJOB_PROGRESS_DIR=str(tmp_path), LOCAL_RANK="0"))
    assert done.returncode == 0, done.stderr
    record = Record.decode(done.stdout.strip().encode())
    assert record is not None, done.stdout
    assert (record.seq, record.optimizer_steps, record.in_collective) == (3, 3, False)
    assert record.frame.startswith("unmodified.py:") and record.frame.endswith("in waiting_here")


def test_where_tells_torch_distributed_from_user_code() -> None:
    import torch.distributed.distributed_c10d as c10d

    torch_dir = frames.torch_dir()
    assert frames.kind(c10d.__file__, torch_dir) == "dist"
    assert frames.kind(torch.__file__, torch_dir) == "torch"
    assert frames.kind(os.__file__, torch_dir) == "stdlib"
    assert frames.kind(__file__, torch_dir) == "user"
    assert frames.kind(frames.__file__, torch_dir) == "kit"
    assert frames.kind(pytest.__file__, torch_dir) == "lib"
    inside, at = frames.where(sys._getframe())
    assert not inside and at.endswith("in test_where_tells_torch_distributed_from_user_code")


def two_nodes(tmp_path: Path, store: Any, now: list[float]) -> list[Watchdog]:
    """The watchdogs of two nodes of one rank each (files under ``tmp_path/NODE``) over
    ``store``, on the clock ``now[0]``."""
    dogs = []
    for node in (0, 1):
        folder = tmp_path / str(node)
        folder.mkdir()
        dog = Watchdog(folder, T, others_first_s=10, say=print, clock=lambda: now[0])
        dog.reset([(0, node, os.getpid())], node=node, nodes=2, store=store)
        dogs.append(dog)
    return dogs


@pytest.mark.parametrize("when", ["mid-run", "start-up"])
def test_two_nodes_agree_through_the_store_on_the_culprit(tmp_path: Path, when: str) -> None:
    """Node 1's rank stalls in its own code, node 0's rank waits in the collective: node 0
    names it from what both told the store; node 1 acts, node 0 leaves it the first move. In
    start-up too: node 0's rank waits in its first collective, node 1's never reaches it (no
    rank has progressed: the culprit's node tells once it is quiet that long since it began)."""
    store = HashStore()
    now = [0.0]
    dogs = two_nodes(tmp_path, store, now)

    def tell(node: int, seq: int, coll: bool, frame: str) -> None:
        beats = int(now[0]) + 1
        (tmp_path / str(node) / "0").write_bytes(Record(
            beats=beats, pid=os.getpid(), seq=seq, in_collective=coll, frame=frame).encode())

    for t in range(0, 40):
        now[0] = float(t)
        if when == "mid-run":
            tell(0, 10 + min(t, 5), True, "")  # waits from t=5 in collective 15
            tell(1, 10 + min(t, 4), False, "user.py:3 in stuck_here")  # stuck after 14
        else:
            tell(0, 1, True, "")  # in its first collective from its first read (t=1)
            tell(1, 0, False, "user.py:3 in stuck_here")  # never reaches it
        acts = [dog.poll() for dog in dogs]
        if any(acts):
            break
    assert acts[0] is None and acts[1] is not None, (t, acts)
    assert [w.rank for w in acts[1].stuck] == [1]
    # mid-run: node 1 stalled from 4, node 0 waits from 5: its timeout; start-up: node 0's
    # rank seen inside from t=1
    assert t == {"mid-run": 25, "start-up": 21}[when]
    assert "rank 1 on node 1 (" in acts[1].finding.why and "stuck_here" in acts[1].finding.why
    assert "1 collective(s) behind the others" in acts[1].finding.why
    assert [d.first_dump() for d in dogs] == [True, True]  # both nodes write their stacks


class CountingStore(HashStore):
    """A store that counts what each request asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def set(self, key: str, value: str) -> None:  # type: ignore[override]
        self.calls.append(("set", (key,)))
        super().set(key, value)

    def check(self, keys: list[str]) -> bool:  # type: ignore[override]
        self.calls.append(("check", tuple(keys)))
        return super().check(keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        self.calls.append(("multi_get", tuple(keys)))
        return super().multi_get(keys)


def test_a_long_start_up_costs_the_store_one_check_per_node_per_second(tmp_path: Path) -> None:
    """Every rank in start-up for three timeouts (loading data, say), none inside a collective:
    no hang, and no node tells its ranks (node 0 reads nobody's), each only asks whether some
    rank waits; once one does, both tell (test_two_nodes_agree_...: the culprit is named)."""
    store = CountingStore()
    now = [0.0]
    dogs = two_nodes(tmp_path, store, now)
    for t in range(0, 3 * int(T)):
        now[0] = float(t)
        for node in (0, 1):
            (tmp_path / str(node) / "0").write_bytes(Record(
                beats=t + 1, pid=os.getpid(), frame="user.py:3 in load").encode())
        assert [dog.poll() for dog in dogs] == [None, None]
    assert {call for call in store.calls} == {("check", (WAITING_KEY,))}, store.calls
    assert len(store.calls) <= 2 * 3 * T, len(store.calls)
    store.calls.clear()
    now[0] += 1  # node 0's rank enters its first collective and waits there
    (tmp_path / "0" / "0").write_bytes(Record(beats=99, pid=os.getpid(), seq=1,
                                              in_collective=True).encode())
    for t in range(int(T)):
        now[0] += 1
        for dog in dogs:
            dog.poll()
    told = {key for op, keys in store.calls if op == "set" for key in keys}
    assert {"torchjob.hang.node0", "torchjob.hang.node1", WAITING_KEY} <= told, store.calls


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


def test_a_stopped_rank_is_placed_where_it_stopped_not_where_its_heartbeat_last_was(
        tmp_path: Path) -> None:
    """A rank that stops between two heartbeats: its last one told a frame of its start-up;
    the watchdog reads where it stopped from outside (py-spy) and says it is there now."""
    script = tmp_path / "stops.py"
    script.write_text("import os, signal\ndef stop_here():\n    print('up', flush=True)\n"
                      "    os.kill(os.getpid(), signal.SIGSTOP)\nstop_here()\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        for _ in range(1000):
            if process_state(proc.pid) == "T":
                break
            subprocess.run(["true"])  # yield a moment without sleeping on a clock
        worker = Seen(0, 3, proc.pid, 0.0, state="T")
        worker.read(Record(beats=1, pid=proc.pid, frame="startup.py:1 in boot"), 0.0)
        assert "last seen at startup.py:1 in boot" in worker.view(1.0, 0).named()
        worker.look(1.0)
        named = worker.view(1.0, 0).named()
        assert named == "rank 3 on node 0 (its process is stopped (state T); at stops.py:4 " \
            "in stop_here)", (named, stack_of(proc.pid))
        worker.read(Record(beats=2, pid=proc.pid, frame="startup.py:2 in boot"), 2.0)
        worker.state = "S"  # it beats again: its heartbeat tells again
        assert worker.view(2.0, 0).frame == "startup.py:2 in boot"
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

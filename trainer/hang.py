"""The hang watchdog, the agent's side: no progress for ``hang_timeout`` -> stacks written, the
culprit rank named (trainer.culprit), the group restarted from its last checkpoint.

It reads each local worker's progress file (trainer.progress) and ``/proc``, timed by this
agent's clock. With several nodes, each node whose ranks stall tells the round's store, node
0 names the culprit for all, and the culprit's node acts. The rules: docs/internals.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from torchjob.trainer.contract import EXIT_RETRY
from torchjob.trainer.failures import timed_out
from torchjob.trainer.culprit import STOPPED, Finding, RankView, find, hung, ranks
from torchjob.trainer.progress import BEAT_S, NO_STEP, Record
from torchjob.trainer.stacks import frame_of, kill, process_state, stack_of, wchan

READ_EVERY_S = 1.0  # how often the agent reads the progress files
BEAT_LOST_S = 5 * BEAT_S  # no heartbeat for this long: the process is stopped or frozen
# Every node writes its stacks this long before the timeout: the node that acts on the hang
# kills its workers at the timeout, and the peers on other nodes exit as soon as they lose them
DUMP_LEAD_S = 2 * READ_EVERY_S
# a rank that gave up waiting in a collective exits within this: one still there after it
# did not (trainer.hang.Watchdog.waited_for)
LEAVING_S = 1.0
# a rank that lost its peers after waiting this long in init_process_group waited for a rank
# of its node that never came there (Watchdog.left_init)
INIT_WAIT_S = 1.0
# after a stop signal, heartbeats that still find a worker in init_process_group: the first
# may have looked before the signal came (Watchdog.ending_stuck_in_init)
STOP_BEATS = 2
LOOKS = 3  # tries at a silent rank's frame from outside (py-spy) per silent stretch
NODE_KEY, FINDING_KEY = "torchjob.hang.node{}", "torchjob.hang.finding"  # the round's store
# set by a node whose rank waits near the timeout (idle or inside a collective): from then on
# every node that stalls tells its ranks; before, a stall that is only a long start-up costs
# the store one check per node per second, and node 0 reads nobody's ranks
WAITING_KEY = "torchjob.hang.waiting"


@contextmanager
def beside(loop: Callable[[threading.Event], None], name: str | None = None) -> Iterator[None]:
    """While inside: ``loop(done)`` in a daemon thread of its own (named ``name``), which ends
    once ``done`` is set (on leaving, which waits for it)."""
    done = threading.Event()
    thread = threading.Thread(target=loop, args=(done,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@dataclass
class Seen:
    """One local worker as this agent last saw it (times on the agent's monotonic clock):
    ``step_at`` is its last progress (a step, a collective or an optimizer step) or its start,
    ``entered_at`` the first read that saw it inside the collective it is in, ``exiting_at``
    the first that saw its script returned and its exit held by a thread of its own;
    ``init_wait``: how long reads saw it waiting in init_process_group (kept once it left:
    its last heartbeat may come from its way out, its error file being written)."""

    local_rank: int
    rank: int
    pid: int
    started: float
    record: Record | None = None  # None: its file not seen yet (not judged)
    step_at: float = 0.0
    beat_at: float = 0.0
    entered_at: float = 0.0
    exiting_at: float = 0.0
    init_wait: float = 0.0
    state: str = "?"  # /proc state letter; "" when the process is gone
    outside: str = ""  # while silent: its frame read from outside (stacks.frame_of)
    looks: int = 0  # tries at that since it went silent

    def __post_init__(self) -> None:
        self.step_at = self.beat_at = self.started

    @property
    def step(self) -> int:
        return self.record.step if self.record else NO_STEP

    @property
    def counted(self) -> bool:
        """Past its start-up: it reported a step or an optimizer step, or finished a
        collective (it entered a second one). Before, only its heartbeat is judged."""
        r = self.record
        return r is not None and (r.step != NO_STEP or r.seq >= 2 or r.optimizer_steps > 0)

    @property
    def alive(self) -> bool:
        return self.state not in ("", "Z", "X")

    def read(self, record: Record, now: float) -> None:
        old = self.record or Record(beats=-1)
        if (record.step, record.seq, record.optimizer_steps) != (
                old.step, old.seq, old.optimizer_steps):
            self.step_at = now
        if record.beats != old.beats:
            self.beat_at, self.outside, self.looks = now, "", 0
        if record.in_collective and (not old.in_collective or record.seq != old.seq):
            self.entered_at = now
        if record.in_collective and record.seq < 0:  # no process group yet: in init
            self.init_wait = now - self.entered_at
        if record.exiting and not old.exiting:
            self.exiting_at = now
        self.record = record

    def silent(self, now: float) -> bool:
        return self.alive and self.record is not None and (
            self.state in STOPPED or now - self.beat_at >= BEAT_LOST_S)

    def view(self, now: float, node: int) -> RankView:
        r = self.record or Record()
        idle = now - (self.exiting_at if r.exiting else self.step_at if self.counted
                      else self.beat_at)
        silent = self.silent(now)
        outside = silent and bool(self.outside)  # else its last heartbeat's frame
        return RankView(self.rank, node, r.step, r.seq, self.counted, r.in_collective,
                        self.state, self.outside if outside else r.frame, round(idle, 1),
                        round(now - self.beat_at, 1), silent,
                        wchan(self.pid) if self.state not in ("R", "") else "", outside,
                        round(now - self.entered_at, 1) if r.in_collective else 0.0, r.exiting)

    def look(self, now: float) -> None:
        """While silent (its heartbeat cannot tell where it is): its frame from outside, a
        few tries at most."""
        if self.silent(now) and not self.outside and self.looks < LOOKS:
            self.looks += 1
            self.outside = frame_of(self.pid)

    def last(self) -> str:
        """Its last step: the one it reported, else the optimizer steps counted."""
        if self.step != NO_STEP:
            return f"last step {self.step}"
        steps = self.record.optimizer_steps if self.record else 0
        return f"last step {steps} (optimizer steps counted)" if steps else "no step yet"

    def describe(self, now: float, node: int = 0) -> str:
        return f"{self.last()}, {self.view(now, node).how()}"


@dataclass(frozen=True)
class Looked:
    """What ``Watchdog.look_at_failure`` found: the workers stuck as the group failed, why
    each (by rank), the hang a timed-out collective told (None: they were silent or stopped),
    and where their stacks went."""

    stuck: list[Seen]
    named: dict[int, str]
    hang: Hang | None
    where: str


@dataclass(frozen=True)
class Hang:
    """A hang this node acts on: the finding and its own workers to report as stuck."""

    finding: Finding
    stuck: tuple[Seen, ...]


def stuck_line(w: Seen, finding: Finding, now: float, node: int) -> str:
    """Why ``w`` was stuck, for its failure line (trainer.failures): how, where, and who
    waited for it."""
    view = next((v for v in finding.culprits if v.rank == w.rank), None)
    if view is None:
        return f"{w.describe(now, node)}; {finding.why}"
    at = f", {view.where()}" if view.frame else ""
    waiting = f"; waiting for it: rank(s) {ranks(finding.waiting)}" if finding.waiting else ""
    return f"{w.last()}, {view.how()}{at}; {finding.reason}{waiting}"


def read_record(path: Path) -> Record | None:
    """A progress file's record; None when absent or half-written."""
    try:
        return Record.decode(path.read_bytes())
    except OSError:
        return None


class Watchdog:
    """One agent's watch over its local workers (torchjob.trainer.torchrun_agent calls it)."""

    def __init__(self, folder: Path, timeout: float, *, others_first_s: float,
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.folder, self.timeout, self.others_first_s = folder, timeout, others_first_s
        self.say, self.clock = say, clock
        self.seen: list[Seen] = []
        self.node, self.nodes = 0, 1
        self.store: Any = None
        self.read_at = self.quiet_since = 0.0
        self.dumped = self.near = False  # near: its own ranks near the timeout (last read)
        self.waiting = False  # WAITING_KEY is known set in this round's store
        self.finding: Finding | None = None

    def clear(self) -> None:
        """Before a group starts: no file of the last one is read as this one's."""
        for path in self.folder.glob("*"):
            path.unlink(missing_ok=True)

    def reset(self, workers: Iterable[tuple[int, int, int]], *, node: int = 0, nodes: int = 1,
              store: Any = None) -> None:
        """A new group started: (local rank, global rank, pid) of each worker, this node's
        place and the round's store (None: this node judges alone)."""
        now = self.clock()
        self.seen = [Seen(local, rank, pid, now) for local, rank, pid in workers]
        self.node, self.nodes, self.store = node, nodes, store if nodes > 1 else None
        self.read_at, self.quiet_since, self.dumped, self.finding = now, 0.0, False, None
        self.near = self.waiting = False

    def observe(self, force: bool = False) -> float:
        """Read the files (at most once per READ_EVERY_S unless ``force``); the time."""
        now = self.clock()
        if not force and now - self.read_at < READ_EVERY_S:
            return now
        self.read_at = now
        for w in self.seen:
            w.state = process_state(w.pid)
            record = read_record(self.folder / str(w.local_rank))
            if record is not None and record.pid == w.pid:
                w.read(record, now)
        return now

    @contextmanager
    def ending_stuck_in_init(self) -> Iterator[None]:
        """While a stop signal is sent and torch waits for the workers to exit (30 s, then
        SIGKILL): kill each whose heartbeats, STOP_BEATS of them after it, still find it in
        init_process_group with no step. Its handler would hear the signal only once init
        returns, and the peers init waits for may be ones the stop ended; a worker with no
        process group yet has nothing to checkpoint."""
        self.observe(force=True)
        then = {w.pid: w.record.beats if w.record else 0 for w in self.seen}

        def watch(done: threading.Event) -> None:
            while not done.wait(BEAT_S / 2):
                self.observe(force=True)
                kill([w.pid for w in self.seen if w.alive and w.record is not None
                      and w.record.beats - then[w.pid] >= STOP_BEATS and w.record.seq < 0
                      and w.record.in_collective and w.record.step == NO_STEP])
        with beside(watch, "torchjob-stop-in-init"):
            yield

    def views(self, now: float) -> list[RankView]:
        return [w.view(now, self.node) for w in self.seen if w.alive and w.record is not None]

    def poll(self) -> Hang | None:
        """While the group runs: a Hang when this node acts on one now, else None (it writes
        the stacks once its own ranks near the timeout: ``first_dump``)."""
        before = self.read_at
        now = self.observe()
        if self.read_at == before:  # nothing new read
            return None
        lead = self.timeout - DUMP_LEAD_S
        if not any(now - w.step_at >= lead for w in self.seen
                   if w.alive and w.record is not None):
            self.quiet_since, self.dumped, self.finding, self.near = 0.0, False, None, False
            return None  # every rank progressed (or started) within the lead
        for w in self.seen:
            w.look(now)  # a silent one's frame from outside
        views = self.views(now)
        if any(v.idle_s >= lead or v.waited_s >= lead for v in views):
            self.quiet_since = self.quiet_since or now
        self.near = hung(views, lead)  # this node's own ranks near the timeout
        self.finding = self.finding or self._exchange(views, now)
        if self.finding is None and hung(views, self.timeout) and (
                self.store is None or now - self.quiet_since >= DUMP_LEAD_S + self.others_first_s):
            self.finding = find(views, self.timeout)  # alone, or nobody told: this node's view
        return self._act(now) if self.finding is not None else None

    def _exchange(self, views: list[RankView], now: float) -> Finding | None:
        """Tell the round's store this node's ranks, once some node's rank waits near the
        timeout (``WAITING_KEY``); node 0 names the culprit for every node once the timeout is
        reached (what all stalled nodes told); the others read it."""
        if self.store is None:
            return None
        try:
            if not self.waiting:
                if self.quiet_since:  # a rank of this node waits
                    self.store.set(WAITING_KEY, "1")
                elif not self.store.check([WAITING_KEY]):
                    return None  # nobody waits: a long start-up, say, is no hang yet
                self.waiting = True
            self.store.set(NODE_KEY.format(self.node), json.dumps([v.to_json() for v in views]))
            if self.node != 0:
                if self.store.check([FINDING_KEY]):
                    return Finding.from_json(json.loads(self.store.get(FINDING_KEY)))
                return None
            if now - self.quiet_since < DUMP_LEAD_S:
                return None
            every = self._told()
            if not hung(every, self.timeout):
                return None
            finding = find(every, self.timeout)
            self.store.set(FINDING_KEY, json.dumps(finding.to_json()))
            return finding
        except Exception as exc:  # the store is gone: each node judges alone (poll)
            self.say(f"torchjob: the hang watchdog cannot reach the store ({exc}): this node "
                     "judges its own ranks")
            self.store = None
            return None

    def _told(self) -> list[RankView]:
        """What every node told: two requests when all did, else one or two per node."""
        keys = [NODE_KEY.format(node) for node in range(self.nodes)]
        if self.store.check(keys):
            told = self.store.multi_get(keys)
        else:
            told = [self.store.get(key) for key in keys if self.store.check([key])]
        return [RankView.from_json(v) for data in told for v in json.loads(data)]

    def _act(self, now: float) -> Hang | None:
        """This node acts when it holds a culprit, at once; when none was told apart, or
        the culprit's node did not act, after ``others_first_s``."""
        finding = self.finding
        assert finding is not None
        mine = {v.rank for v in finding.culprits if v.node == self.node}
        if mine:
            return Hang(finding, tuple(w for w in self.seen if w.rank in mine))
        waited = now - self.quiet_since >= DUMP_LEAD_S + self.others_first_s
        if self.store is None and not finding.culprits or waited:
            return Hang(finding, tuple(w for w in self.seen if w.alive))
        return None

    def first_dump(self) -> bool:
        """True once per stalled stretch, when this node's ranks near the timeout or a finding
        is known (this node's ranks are culprits or wait for one): the caller writes the stacks
        then."""
        if self.dumped or not (self.near or self.finding is not None):
            return False
        self.dumped = True
        return True

    def waited_for(self, timed_out: dict[int, float], now: float,
                   why: str = "") -> Hang | None:
        """After local ranks gave up waiting in a collective (``timed_out``: rank -> the process
        group's timeout, s; ``why``: how they gave up, if not by that timeout): the live local
        ranks they waited for, told apart as a hang's culprits are (behind in collectives,
        outside the one they waited in), as read at ``now``; None when there is none here."""
        if not timed_out:
            return None
        after = max(timed_out.values())
        why = why or (f"timed out waiting for it in a collective after {after:g} s (the "
                      "process group's timeout: raise it if this rank is slow, not stuck)")
        for w in self.seen:
            w.look(now)  # a silent one's frame from outside
        views = [replace(w.view(now, self.node), in_collective=True) if w.rank in timed_out
                 else w.view(now, self.node) for w in self.seen
                 if w.record is not None and (w.alive or w.rank in timed_out)]
        finding = find(views, after,
                       f"rank(s) {ranks(v for v in views if v.rank in timed_out)} {why}")
        culprits = {v.rank for v in finding.culprits}
        stuck = tuple(w for w in self.seen if w.rank in culprits and w.alive)
        if not culprits or culprits & timed_out.keys() or len(stuck) < len(culprits):
            return None
        # a rank at the sequence of those that timed out and outside a collective may be
        # leaving one that timed out too: it is a culprit only if it is still there a moment on
        behind = min((v.seq for v in views if v.rank in timed_out), default=NO_STEP)
        unsure = {v.rank for v in finding.culprits if not v.silent and v.seq >= behind}
        if unsure and not self._stay([w for w in stuck if w.rank in unsure]):
            return None
        return Hang(finding, stuck)

    def left_init(self, failed: Mapping[int, Any]) -> dict[int, float]:
        """The local ranks among torch's ``failed`` that lost their peers after waiting at least
        ``INIT_WAIT_S`` in init_process_group (no process group yet), with how long (s): the
        store's host, on another node, gave up on a rank that never came."""
        return {w.rank: round(w.init_wait, 1) for w in self.seen
                if w.local_rank in failed and failed[w.local_rank].exitcode == EXIT_RETRY
                and w.record is not None and w.record.seq < 0 and w.init_wait >= INIT_WAIT_S}

    def _stay(self, workers: list[Seen]) -> bool:
        """Whether every one of ``workers`` still runs after ``LEAVING_S`` (False as soon as
        one has exited)."""
        deadline = self.clock() + LEAVING_S
        while True:
            if any(process_state(w.pid) in ("", "Z", "X") for w in workers):
                return False
            if self.clock() >= deadline:
                return True
            time.sleep(0.05)

    def look_at_failure(self, failed: Mapping[int, Any], node: int,
                        hangs: Path | None) -> Looked | None:
        """As the group fails (torch's ``failed``, by local rank), before the rest is stopped:
        the rank that a timed-out collective waited for, else the silent or stopped ranks, with
        their stacks written (into ``hangs``, else the log); None when there is none."""
        now, of = self.observe(force=True), {w.local_rank: w.rank for w in self.seen}
        hang = self.waited_for({of[local]: s for local, s in timed_out(failed).items()
                                if local in of}, now)
        if hang is None and (left := self.left_init(failed)):
            hang = self.waited_for(left, now, f"waited {max(left.values()):g} s for it in "
                                   "init_process_group until the group's store went away (a "
                                   "rank on another node gave up waiting and left)")
        silent = [] if hang else [w for w in self.seen
                                  if w.silent(now) and w.local_rank not in failed]
        if hang is not None:
            named = {w.rank: stuck_line(w, hang.finding, now, node) for w in hang.stuck}
        else:
            named = {w.rank: f"{w.describe(now, node)}; silent when the group failed"
                     for w in silent}
        if not named:
            return None
        where = self.dump(hangs, node, [w for w in self.seen if w.alive]) \
            if not self.dumped else str(hangs or "the log above")
        self.dumped = True
        return Looked(list(hang.stuck) if hang else silent, named, hang, where)

    def dump(self, folder: Path | None, node: int, workers: Iterable[Seen]) -> str:
        """Every given worker's stacks into ``folder`` (or the log); where they went."""
        now = self.clock()
        texts = {}
        for w in workers:
            head = (f"node {node} rank {w.rank} (local rank {w.local_rank}) pid {w.pid}: "
                    f"{w.describe(now, node)}; last progress {now - w.step_at:.1f} s ago, last "
                    f"heartbeat {now - w.beat_at:.1f} s ago\n\n")
            texts[w.rank] = head + stack_of(w.pid)
        if folder is not None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                for rank, text in texts.items():
                    (folder / f"node{node}-rank{rank}.txt").write_text(text)
                return str(folder)
            except OSError as exc:
                self.say(f"torchjob: cannot write the stacks into {folder} ({exc}): here")
        for text in texts.values():
            self.say(text)
        return "the log above"

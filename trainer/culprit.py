"""Which rank hangs, pure: from what every rank told (trainer.progress) and its process state,
on one node or gathered from all of them (trainer.hang). The rules in order: a silent or
stopped rank; the ranks behind in collective sequence; the ranks behind in steps; the ranks
outside any collective while others wait in one. Why: docs/internals.md (trainer/hang.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

STOPPED = ("T", "t")  # /proc/PID/stat states: stopped by a signal, stopped by a tracer
AT_EXIT = "its script ended, but its exit waits for "  # + its threads (trainer.failures)


@dataclass(frozen=True)
class RankView:
    """One rank as its agent saw it: seconds without progress (``idle_s``: since its last step,
    collective or optimizer step; before its first, since its last heartbeat), without a
    heartbeat (``silent_s``) and inside the collective it is in (``waited_s``; 0 outside one)."""

    rank: int
    node: int
    step: int
    seq: int
    counted: bool  # it reported a step, a collective or an optimizer step
    in_collective: bool
    state: str
    frame: str
    idle_s: float
    silent_s: float
    silent: bool
    wchan: str = ""
    outside: bool = False  # its frame read from outside now, not its last heartbeat's
    waited_s: float = 0.0
    exiting: str = ""  # its script returned; its exit waits for this (its threads)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankView:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def how(self) -> str:
        if self.state in STOPPED:
            return "its process is stopped (state T)"
        if self.silent:
            return f"no heartbeat for {self.silent_s:.0f} s"
        running = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O"}
        state = running.get(self.state, f"state {self.state}")
        return state + (f" in {self.wchan}" if self.wchan and self.state != "R" else "")

    def where(self) -> str:
        """at its frame; "last seen at" one its heartbeat told before it went silent."""
        return f"{'last seen ' * (self.silent and not self.outside)}at {self.frame}"

    def named(self) -> str:
        at = f"; {self.where()}" if self.frame else ""
        return f"rank {self.rank} on node {self.node} ({self.how()}{at})"


@dataclass(frozen=True)
class Finding:
    """The culprits (empty: none could be told apart, every rank waits), the waiting ranks,
    and one line that says so."""

    culprits: tuple[RankView, ...]
    waiting: tuple[RankView, ...]
    why: str
    reason: str = ""  # what sets the culprits apart

    def to_json(self) -> dict[str, Any]:
        return {"culprits": [v.to_json() for v in self.culprits],
                "waiting": [v.to_json() for v in self.waiting], "why": self.why,
                "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(tuple(RankView.from_json(v) for v in data["culprits"]),
                   tuple(RankView.from_json(v) for v in data["waiting"]), str(data["why"]),
                   str(data["reason"]))


def hung(views: Iterable[RankView], timeout: float) -> bool:
    """A hang: a rank silent for ``timeout``, a rank that reports steps idle that long, a rank
    without progress that long while some rank waits for another, (in start-up too) a rank
    inside one collective that long while another has not entered it, or a rank whose script
    returned that long ago while a thread of its own holds its exit."""
    views = list(views)
    seqs = {v.seq for v in views}
    waits = any(v.in_collective for v in views) or len(seqs) > 1
    apart = len(seqs) > 1 or not all(v.in_collective for v in views)
    return any(v.silent and v.idle_s >= timeout or v.step >= 0 and v.idle_s >= timeout
               or waits and v.idle_s >= timeout or apart and v.waited_s >= timeout
               or bool(v.exiting) and v.idle_s >= timeout for v in views)


def ranks(views: Iterable[RankView]) -> str:
    found = sorted(v.rank for v in views)
    return ", ".join(map(str, found)) if len(found) < 9 else f"{found[0]}-{found[-1]} " \
        f"({len(found)} ranks)"


def find(views: Iterable[RankView], timeout: float, stalled: str = "") -> Finding:
    """Who hangs among ``views`` (every rank of the group, or of the nodes that told);
    ``stalled`` says how the hang showed (default: no progress for ``timeout``)."""
    stalled = stalled or f"no progress for {timeout:g} s"
    views = sorted(views, key=lambda v: v.rank)
    silent = [v for v in views if v.silent]
    seqs, steps = sorted({v.seq for v in views}), sorted({v.step for v in views})
    inside = [v for v in views if v.in_collective]
    exiting = [v for v in views if v.exiting]
    if silent:
        culprits, why = silent, "stuck"
    elif exiting:
        culprits, why = exiting, f"{AT_EXIT}{exiting[0].exiting} (not a daemon)"
    elif len(seqs) > 1:
        culprits = [v for v in views if v.seq == seqs[0]]
        behind = seqs[1] - seqs[0]
        why = (f"{behind} collective(s) behind the others (sequence {seqs[0]}, the others "
               f"{', '.join(map(str, seqs[1:]))})") if seqs[0] >= 0 else \
            "not yet in the process group the others use"
    elif len(steps) > 1:
        culprits = [v for v in views if v.step == steps[0]]
        why = f"behind the others (steps {steps})"
    elif inside and len(inside) < len(views):
        culprits = [v for v in views if not v.in_collective]
        why = "outside any collective while the others wait in one"
    else:
        return Finding((), tuple(views), f"{stalled} and no rank told apart: ranks "
                       f"{ranks(views)} all wait (a deadlock, or a lost link)")
    waiting = tuple(v for v in views if v not in culprits)
    text = "; ".join(v.named() for v in culprits) + f" {why}: {stalled}"
    if waiting:
        text += f"; waiting for it: rank(s) {ranks(waiting)}"
    return Finding(tuple(culprits), waiting, text, f"{why}: {stalled}")

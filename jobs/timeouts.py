"""The job's timeouts as one hierarchy, derived from the spec in one place: ``resolve`` gives each
its value and where it comes from, ``check`` refuses an order that would silently disable the
hang watchdog or lose a stop's checkpoint (a SpecError naming both values and the fix), and
``table`` is what ``torchjob render`` shows on stderr. Pure. The README's table says why.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

from torchjob.jobs.values import SpecError
from torchjob.trainer.contract import NCCL_HEARTBEAT_ENV, STORE_TIMEOUT_S, nccl_heartbeat_s
from torchjob.trainer.hang import BEAT_LOST_S, DUMP_LEAD_S
from torchjob.trainer.progress import BEAT_S

FIXED = "fixed"  # a constant of torchjob's (trainer.contract, trainer.hang, trainer.progress)


@dataclass(frozen=True)
class Timeout:
    """One timeout: its name in the table, seconds (0: off), where it comes from (a spec field
    path, an option, ``fixed`` or ``derived: ...``) and what it bounds."""

    name: str
    seconds: float
    source: str
    bounds: str

    @property
    def settable(self) -> bool:
        return self.source != FIXED and not self.source.startswith("derived")


@dataclass(frozen=True)
class Timeouts:
    """Every timeout of a job, in the order the table shows them."""

    heartbeat: Timeout
    heartbeat_lost: Timeout
    hang_dump_lead: Timeout
    checkpoint_budget: Timeout
    hang: Timeout
    collective: Timeout
    nccl_heartbeat: Timeout
    stop_grace: Timeout
    slurm_signal_lead: Timeout
    store: Timeout
    rdzv_last_call: Timeout
    rdzv_join: Timeout

    def rows(self) -> list[Timeout]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


@dataclass(frozen=True)
class Rule:
    """``lower`` must be below ``upper`` (or equal, unless ``strict``; when ``applies``);
    ``blame``: the one whose field the error names; ``why``: what goes wrong otherwise."""

    lower: str
    upper: str
    blame: str
    why: str
    applies: Callable[[Timeouts], bool] = lambda t: True
    strict: bool = True


def _hang_on(t: Timeouts) -> bool:
    return t.hang.seconds > 0


RULES = (
    Rule("heartbeat_lost", "hang", "hang", "a stopped or frozen rank is named only once its "
         "heartbeat is lost, by the hang timeout", _hang_on, strict=False),
    Rule("hang_dump_lead", "hang", "hang", "every node writes its stacks this long before the "
         "hang timeout", _hang_on),
    Rule("hang", "collective", "hang", "a stuck collective would fail first, so the hang "
         "watchdog never writes the stacks nor names the stuck rank", _hang_on),
    Rule("collective", "nccl_heartbeat", "nccl_heartbeat", "NCCL's watchdog monitor would "
         "kill the process before a collective fails by its own timeout"),
    Rule("checkpoint_budget", "hang", "checkpoint_budget", "a stop's checkpoint that takes its "
         "budget would be taken for a hang and the workers restarted mid-save", _hang_on),
    Rule("checkpoint_budget", "stop_grace", "stop_grace", "the kill would come before the "
         "stop's checkpoint is written"),
    Rule("checkpoint_budget", "slurm_signal_lead", "slurm_signal_lead", "Slurm's time limit "
         "would end the job before the checkpoint its signal asked for is written",
         lambda t: t.slurm_signal_lead.seconds > 0),
    Rule("rdzv_last_call", "rdzv_join", "rdzv_last_call", "the rendezvous would wait for more "
         "nodes longer than for the first ones"),
)


def _nccl_heartbeat(spec: Any) -> Timeout:
    """NCCL's watchdog heartbeat: the job's env when it sets it, else derived (the agent's)."""
    bounds = "NCCL's watchdog monitor: a stuck process is killed (GPU jobs)"
    raw = spec.env.get(NCCL_HEARTBEAT_ENV)
    if raw is None:
        return Timeout("NCCL heartbeat", nccl_heartbeat_s(spec.collective_timeout),
                       "derived: collective_timeout + 180", bounds)
    path = f"env.{NCCL_HEARTBEAT_ENV}"
    if not raw.isdigit():
        raise SpecError(path, f"{raw!r} is not a whole number of seconds (torch reads it as "
                        f"one; e.g. {nccl_heartbeat_s(spec.collective_timeout)}), or remove "
                        "it: torchjob sets it above collective_timeout")
    return Timeout("NCCL heartbeat", int(raw), path, bounds)


def resolve(spec: Any, grace: float | None = None) -> Timeouts:
    """The timeouts of ``spec`` (a JobSpec); ``grace``: ``--grace``, which overrides the spec's
    ``stop_grace`` for local and docker runs."""
    return Timeouts(
        heartbeat=Timeout("heartbeat", BEAT_S, FIXED, "a worker's sign of life to its agent"),
        heartbeat_lost=Timeout("heartbeat lost", BEAT_LOST_S, FIXED,
                               "silence after which a worker counts as stopped or frozen"),
        hang_dump_lead=Timeout("hang dump lead", DUMP_LEAD_S, FIXED,
                               "stacks written this long before the hang timeout"),
        checkpoint_budget=Timeout("checkpoint budget", spec.checkpoint_budget,
                                  "checkpoint_budget", "after a stop signal: the step and the "
                                  "checkpoint, then the trainer exits without one"),
        hang=Timeout("hang", spec.hang_timeout, "hang_timeout", "no progress: stacks, stuck "
                     "rank named, restart (0: off)"),
        collective=Timeout("collective", spec.collective_timeout, "collective_timeout",
                           "one collective's wait before it fails (process group timeout)"),
        nccl_heartbeat=_nccl_heartbeat(spec),
        stop_grace=Timeout("stop grace", spec.stop_grace if grace is None else grace,
                           "stop_grace" if grace is None else "--grace", "a stop signal -> "
                           "the kill (K8s terminationGracePeriodSeconds, docker stop, local)"),
        slurm_signal_lead=Timeout("Slurm signal lead", spec.slurm.signal_delay,
                                  "slurm.signal_delay", "USR2 this long before Slurm's time "
                                  "limit (0: none)"),
        store=Timeout("store request", STORE_TIMEOUT_S, FIXED,
                      "one request to the job's own rendezvous store"),
        rdzv_last_call=Timeout("rdzv last call", spec.rdzv.last_call_timeout,
                               "rdzv.last_call_timeout", "more nodes, once MIN joined"),
        rdzv_join=Timeout("rdzv join", spec.rdzv.join_timeout, "rdzv.join_timeout",
                          "MIN nodes to join"),
    )


def problem(rule: Rule, timeouts: Timeouts) -> SpecError | None:
    """The SpecError of ``rule`` broken by ``timeouts``, else None."""
    low, high = getattr(timeouts, rule.lower), getattr(timeouts, rule.upper)
    if not rule.applies(timeouts) or low.seconds < high.seconds or (
            not rule.strict and low.seconds == high.seconds):
        return None
    blamed = getattr(timeouts, rule.blame)
    other = high if blamed is low else low
    side = ("below" if blamed is low else "above") if rule.strict else \
        ("at most" if blamed is low else "at least")
    shown = f"{other.source} {other.seconds:g} s" if other.settable else \
        f"the {other.name} time, {other.seconds:g} s ({other.source})"
    fix = f"set {blamed.source} {side} {other.seconds:g}"
    if other.settable:
        fix += f" or {other.source} {'above' if side == 'below' else 'below'} " \
               f"{blamed.seconds:g}"
    return SpecError(blamed.source, f"{blamed.seconds:g} s is not {side} {shown}: "
                     f"{rule.why}; {fix}")


def grace_problem(timeouts: Timeouts) -> SpecError | None:
    """A stop grace that is no number of seconds to compare (``--grace`` -1, nan or inf; the
    spec's stop_grace is checked on load): finite and at least 1, as stop_grace's own check."""
    grace, budget = timeouts.stop_grace, timeouts.checkpoint_budget.seconds
    if 1 <= grace.seconds < math.inf:
        return None
    return SpecError(grace.source, f"{grace.seconds:g} is not a time to wait for a stop's "
                     "checkpoint before the kill: give a finite number of seconds above "
                     f"checkpoint_budget ({budget:g}){' and at least 1' if budget < 1 else ''}"
                     f", e.g. {math.floor(budget) * 2 or 2}")


def check(timeouts: Timeouts) -> None:
    """The first rule ``timeouts`` breaks, as a SpecError (field path, both values, the fix)."""
    error = grace_problem(timeouts)
    if error is not None:
        raise error
    for rule in RULES:
        error = problem(rule, timeouts)
        if error is not None:
            raise error


def table(timeouts: Timeouts) -> str:
    """The resolved hierarchy as text (``torchjob render`` prints it on stderr)."""
    rows = [("timeout", "seconds", "from", "what it bounds")] + [
        (t.name, f"{t.seconds:g}", t.source, t.bounds) for t in timeouts.rows()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3]
             for row in rows]
    names = {f.name: getattr(timeouts, f.name).name for f in dataclasses.fields(timeouts)}
    order = "; ".join(f"{names[r.lower]} {'<' if r.strict else '<='} {names[r.upper]}"
                      for r in RULES)
    return "\n".join(["torchjob: the job's timeouts (torchjob.jobs.timeouts):",
                      *(f"  {line.rstrip()}" for line in lines),
                      f"  checked: {order}", ""])

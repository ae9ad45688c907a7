"""Why workers failed, and whether a restart can help: the rule every backend's agent applies.

A worker killed by a signal, killed as hung (trainer.hang) or that lost a peer
(``EXIT_RETRY``) is restarted, up to ``max_restarts``; one that raised fails the job at once
unless ``retry_on_error``; a configuration error (exit 2) never is. Pure.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any, Mapping

from torchjob.trainer.contract import EXIT_CONFIG, EXIT_RETRY, EXIT_STOPPED, signal_of
from torchjob.trainer.culprit import AT_EXIT

# what a collective raises when another process of the group is gone (gloo's transport,
# NCCL's abort); torch's own DistError types are recognised by class
RESTARTING = ": restarting the workers"  # how a restart verdict's line ends
PEER_LOSS_TEXT = ("/gloo/transport/", "Connection closed by peer", "Connection reset by peer",
                  "NCCL communicator was aborted", "ncclRemoteError", "ncclSystemError")


# a collective (gloo) or the store that gave up waiting for a peer: the process group's
# timeout, in ms or s
TIMED_OUT = re.compile(r"(?:[Tt]imed out (?:waiting|after)|wait timeout after) (?P<ms>\d+)ms|"
                       r"Timed out after (?P<s>\d+) seconds")


def timed_out_s(text: str) -> float | None:
    """The timeout a collective or the store gave up after, from its error's text; None when
    the text says no such thing."""
    found = TIMED_OUT.search(text)
    if found is None:
        return None
    return int(found["ms"]) / 1000 if found["ms"] else float(found["s"])


def lost_peer(text: str) -> str:
    """How a worker whose error is ``text`` lost its peer, in the words of its lines."""
    return "lost a peer" if timed_out_s(text) is None else "timed out waiting for a peer"


def timed_out(failures: Mapping[int, Any]) -> dict[int, float]:
    """The ranks among torch's ``failures`` (rank -> its ProcessFailure) that gave up waiting
    for a peer in a collective, with the timeout they gave up after (s)."""
    found = {}
    for rank, failure in failures.items():
        if failure.exitcode == EXIT_RETRY:
            waited = timed_out_s(exception_line(failure.message))
            if waited is not None:
                found[rank] = waited
    return found


def is_peer_loss(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) says another process of the group is
    gone, rather than that this process's own code failed."""
    from torch.distributed import DistError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DistError):
            return True
        if isinstance(current, RuntimeError) and any(t in str(current) for t in PEER_LOSS_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class Failure:
    """One failed worker: where, its exit code and the line of what it raised."""

    node: int
    rank: int
    exitcode: int
    message: str
    timestamp: float
    hung: str = ""  # the hang watchdog killed it (torchjob.trainer.hang): why it was stuck

    @property
    def kind(self) -> str:
        """``config``, ``error`` (its own code failed), ``killed`` (a signal), ``peer`` (lost
        another process), ``stopped`` (checkpointed on a stop signal), ``terminated``
        (SIGTERM: mostly torch closing the rest of the group once one worker failed) or
        ``hung`` (no progress: the watchdog killed it; restarted like a lost worker)."""
        if self.hung:
            return "hung"
        if self.exitcode == -signal.SIGTERM:
            return "terminated"
        if self.exitcode == EXIT_CONFIG:
            return "config"
        if self.exitcode == EXIT_RETRY:
            return "peer"
        if self.exitcode == EXIT_STOPPED:
            return "stopped"
        if signal_of(self.exitcode) is not None:  # -N, or a shell's 128+N for one
            return "killed"
        return "error"

    @property
    def at_exit(self) -> bool:
        """Hung once its script had returned: a thread of its own held its exit."""
        return AT_EXIT in self.hung

    def describe(self) -> str:
        """``node 0 rank 1 raised ValueError: bad`` / ``... was killed by SIGKILL``."""
        where = f"node {self.node} rank {self.rank}"
        kind = self.kind
        if kind == "hung":
            return f"{where} hung ({self.hung})"
        if kind in ("killed", "terminated"):
            return f"{where} was killed by {signal_of(self.exitcode)}"
        what = f" ({self.message})" if self.message else ""
        if kind == "config":
            return f"{where} stopped on a configuration error (exit 2){what}"
        if kind == "peer":
            return f"{where} {lost_peer(self.message)}{what}"
        if kind == "stopped":
            return f"{where} stopped after a checkpoint (exit 143)"
        return (f"{where} raised {self.message}" if self.message
                else f"{where} exited with code {self.exitcode}")


def exception_line(message: Any) -> str:
    """The exception's line from torch's error-file message (a string, or a dict whose
    ``message`` is ``Type: text``): its type and the first line of its text, as a multi-line
    message begins with what failed (torch's C++ errors go on with their stack); '' when there
    is none."""
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "").strip()
    if not text or text.startswith("To enable traceback see:"):  # torch's filler: nothing kept
        return ""
    line = text.splitlines()[0].strip()
    return line[:-1] if line.endswith(":") and " " not in line else line  # "AssertionError:"


@dataclass(frozen=True)
class Verdict:
    """``restart``: True restart, False fail the job, None no cause here (ask the others).
    ``cause``: the failure it rests on; ``why``: one line for the log."""

    restart: bool | None
    cause: Failure | None
    why: str

    def encode(self) -> str:
        return ("restart" if self.restart else "fail") + "\n" + self.why

    @staticmethod
    def decode(text: str) -> "Verdict":
        head, _, why = text.partition("\n")
        return Verdict(head == "restart", None, why)


def within(verdict: Verdict, left: int, limit: int) -> Verdict:
    """``verdict``, or the job's failure where it restarts with no restart ``left`` (of
    ``limit``, max_restarts)."""
    if not verdict.restart or left > 0:
        return verdict
    return Verdict(False, verdict.cause, f"{verdict.why.removesuffix(RESTARTING)}: no restarts "
                   f"left (max_restarts: {limit})")


def judge(failures: list[Failure], *, retry_on_error: bool) -> Verdict:
    """The verdict of one node's failed workers (the earliest failure of the deciding kind)."""
    def first(kind: str) -> Failure | None:
        # the failure times are whole seconds; a SIGABRT is more often the consequence (a
        # C++ abort on a broken connection) than the cause, and so is a peer's closed
        # connection in the same second as another's wait that timed out (that one ended it)
        found = [f for f in failures if f.kind == kind]
        return min(found, key=lambda f: (f.exitcode == -signal.SIGABRT, f.timestamp,
                                         timed_out_s(f.message) is None, f.rank)) \
            if found else None

    if cause := first("config"):
        return Verdict(False, cause, f"{cause.describe()}: a configuration error is never "
                       "retried; fix it and run again")
    held = [f for f in failures if f.at_exit]
    if held and not retry_on_error:
        return Verdict(False, held[0], f"{held[0].describe()}: not retried (a restart would "
                       "run the script again to the same end; end or join the thread before "
                       "the script returns, or make it a daemon)")
    if (cause := first("error")) and not retry_on_error:
        return Verdict(False, cause, f"{cause.describe()}: not retried (a restart is for a "
                       "lost worker, not for what the code raised; retry_on_error: true "
                       "retries it)")
    cause = first("hung") or first("killed") or first("error") or first("stopped")
    if cause is None and not first("peer"):
        cause = first("terminated")  # SIGTERM from outside, to this node's workers alone
    if cause is not None:
        return Verdict(True, cause, f"{cause.describe()}{RESTARTING}")
    return Verdict(None, first("peer"), "")

"""One verdict per rendezvous round, shared by its nodes through the round's own store: a
node where a failure began says restart or fail; a node that only lost a peer waits to hear
it; a node whose workers all finished says so first, so that a later failure fails the job
on every node at once, the finished ones included; a node whose workers still run looks for
a failure every ``LOOK_S``. (``torchjob.trainer.torchrun_agent`` acts on it; why each:
docs/internals.md, "One verdict per round".)
"""

from __future__ import annotations

import time
from typing import Any

from torch.distributed import DistError

from torchjob.trainer.contract import HEARD_FAIL, HEARD_RESTART
from torchjob.trainer.failures import RESTARTING, Verdict

POLL_S = 0.05  # how often a waiting node looks at the store
# A node whose workers only lost a peer waits this long for the verdict of the node where the
# failure began (its agent decides within a monitor interval); none by then: the node is gone,
# restart. A node that fails the job waits as long for the others to have read that.
VERDICT_WAIT_S = 10.0
VERDICT_KEY = "torchjob.verdict"  # in the round's own store: each round decides afresh
VERDICT_READ_KEY = "torchjob.verdict.read"
FAILED_KEY = "torchjob.verdict.failed"  # set once VERDICT_KEY holds a failure: one check
LOOK_S = 1.0  # how often a node whose workers run looks for a failure (one check)
FINISHED_MARK = "finished\n"  # + the node: its workers all ended with 0 (not a verdict)


def cause(verdict: Verdict) -> str:
    return verdict.cause.describe() if verdict.cause else "a worker failed"


class RoundVerdict:
    """The verdict of the round whose store is ``store``, for node ``node`` of ``nodes``.
    ``store_lost``: the store went away while this node waited on it."""

    def __init__(self, store: Any, nodes: int, node: int) -> None:
        self.store, self.nodes, self.node = store, nodes, node
        self.store_lost = False

    def share(self, verdict: Verdict) -> Verdict:
        """The verdict every node of the round acts on: a node where the failure began says
        it (a failure beats a restart, and so does a node that already finished: a restart
        needs every node); a node that only lost a peer waits to hear it."""
        if verdict.restart is None:
            try:
                text = self._hear()
            except DistError:  # the store is lost (or its host left): a retryable end
                self.store_lost = True
                return Verdict(False, None, "the rendezvous store is gone (lost, or its node "
                               "left): stopping")
            if text is None:
                return Verdict(True, verdict.cause, f"{cause(verdict)}; no other node said "
                               f"why within {VERDICT_WAIT_S:g} s{RESTARTING}")
            if (done := _finished(text)) is None:
                heard = Verdict.decode(text)
                return Verdict(heard.restart, None, (HEARD_RESTART if heard.restart
                                                     else HEARD_FAIL) + heard.why)
            return self.fail(Verdict(False, verdict.cause, f"{cause(verdict)} after node "
                                     f"{done} had finished: its workers ended while this "
                                     "node's still needed them"))
        if verdict.restart:
            try:  # the first to say restart, unless another node already failed or finished
                now = _text(self.store.compare_set(VERDICT_KEY, "", verdict.encode()))
                if (done := _finished(now)) is None:
                    self.read()
            except DistError:
                return verdict
            if done is not None:
                why = verdict.why.removesuffix(RESTARTING)
                return self.fail(Verdict(False, verdict.cause, f"{why}: not restarted, as "
                                         f"node {done} had already finished (a restart "
                                         "needs every node)"))
            said = Verdict.decode(now)
            return verdict if said.restart else said
        return self.fail(verdict)

    def fail(self, verdict: Verdict) -> Verdict:
        """Fail the job on every node: say so in the round's store, then give the other
        nodes time to read it (this node may host the store, which ends with it)."""
        try:
            self.store.set(VERDICT_KEY, verdict.encode())
            self.store.set(FAILED_KEY, "1")  # after it: whoever sees this reads the failure
            read = self.store.add(VERDICT_READ_KEY, 1)
            deadline = time.monotonic() + VERDICT_WAIT_S
            while read < self.nodes and time.monotonic() < deadline:
                time.sleep(POLL_S)
                read = self.store.add(VERDICT_READ_KEY, 0)
        except DistError:
            pass  # the store is gone: the other nodes fail on their own
        return verdict

    def finish(self) -> Verdict | None:
        """This node's workers all ended with 0: say so before any restart is said, so that
        none is (``share``). A restart another node said first is returned: the whole group
        restarts, this node's workers too (from their last checkpoint)."""
        try:
            now = _text(self.store.compare_set(VERDICT_KEY, "", f"{FINISHED_MARK}{self.node}"))
        except DistError:
            return None  # the exit barrier finds out
        if _finished(now) is not None or not (said := Verdict.decode(now)).restart:
            return None  # finished (or a failure, which the exit barrier hears)
        self.read()
        return Verdict(True, None, HEARD_RESTART + said.why)

    def failed(self) -> str | None:
        """Why another node failed the job, once it said so, while this finished node waits
        for the others; None until then. That node waits for ``read`` (its store with it).
        One ``check`` per look: VERDICT_KEY holds the finished mark until a failure."""
        if not self.store.check([FAILED_KEY]):
            return None
        return Verdict.decode(_text(self.store.get(VERDICT_KEY))).why

    def heard(self) -> Verdict | None:
        """While this node's workers run: the job's failure, once another node said it (then
        read); None until then, or once the store is gone (torch's rendezvous says so)."""
        try:
            if (why := self.failed()) is None:
                return None
            self.read()
        except DistError:
            return None
        return Verdict(False, None, HEARD_FAIL + why)

    def read(self) -> None:
        """Tell the node that failed the job that this one has read it (and is done with the
        store, which may end with that node)."""
        self.store.add(VERDICT_READ_KEY, 1)

    def _hear(self) -> str | None:
        """The round's verdict (or a finished node's mark) once one is said; None when none
        is within VERDICT_WAIT_S."""
        deadline = time.monotonic() + VERDICT_WAIT_S
        while not self.store.check([VERDICT_KEY]):
            if time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)
        text = _text(self.store.get(VERDICT_KEY))
        if _finished(text) is None:
            self.read()
        return text


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _finished(text: str) -> str | None:
    """The node that said it finished, or None for a verdict."""
    return text[len(FINISHED_MARK):] if text.startswith(FINISHED_MARK) else None

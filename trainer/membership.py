"""A watch on the agent's own membership of the rendezvous (trainer.torchrun_agent uses it): when
the c10d rendezvous has dropped this node from the round it joined, the agent restarts its
workers (they checkpoint first) and joins the next round, as a new node would. Why: torch's
agent would train on in a second group (docs/internals.md).
"""

from __future__ import annotations

import sys
from typing import Any

from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from torchjob.trainer import ledger
from torchjob.trainer.rendezvous import KeyedRendezvousHandler
from torchjob.trainer.static_rounds import rounded

log = agent_api.logger  # torchrun's own agent log, with its format


class MembershipWatch:
    """The agent's rendezvous handler, whose ``num_nodes_waiting`` also counts this node as
    waiting when the rendezvous has dropped it from the round it joined (see the module's
    docstring). Everything else goes to the handler unchanged. It reads the c10d (dynamic)
    handler's shared state, asks the keyed one (trainer.rendezvous: a round's members are fixed
    once it closes), and with others (static, etcd-v2) only forwards."""

    def __init__(self, handler: RendezvousHandler) -> None:
        self._handler = handler
        self._round: int | None = None  # the round this node last joined
        self._closed: bool | None = None  # shutdown()'s result, once called

    def shutdown(self) -> bool:
        """Close the rendezvous once. The agent closes it before a finished job's nodes leave
        together (torchjob.trainer.torchrun_agent); torch's launch_agent calls it again after
        the agent's run, when the node hosting the store may be gone: that call does nothing."""
        if self._closed is None:
            self._closed = bool(self._handler.shutdown())
        return self._closed

    def __getattr__(self, name: str) -> object:
        return getattr(self._handler, name)

    def next_rendezvous(self) -> RendezvousInfo:
        info = self._handler.next_rendezvous()
        if isinstance(self._handler, KeyedRendezvousHandler):
            self._round = self._handler.round
            return info
        state = getattr(self._holder(), "state", None)
        self._round = None if state is None else state.round
        return info

    def num_nodes_waiting(self) -> int:
        waiting = self._handler.num_nodes_waiting()  # syncs the shared state first
        if waiting == 0 and (why := self.dropped()):
            log.warning("%s: restarting the workers to join the next round", why)
            return 1
        return waiting

    def dropped(self) -> str | None:
        """Why this node is no longer a member of the round it joined, or None if it is."""
        holder = self._holder()
        state, node = getattr(holder, "state", None), getattr(self._handler, "_this_node", None)
        if state is None or node is None or self._round is None:
            return None
        if node in getattr(holder, "_dead_nodes", ()):
            # this node's own look at the state found its heartbeat late; only a peer's
            # write of that finding (below) drops it, and heartbeats resume before that
            return None
        if state.round != self._round:
            return (f"the rendezvous moved on from round {self._round} to {state.round} "
                    f"without this node ({node})")
        if node not in state.participants:
            return (f"this node ({node}) was dropped from round {self._round} of the "
                    "rendezvous: the other nodes saw no heartbeat from it in time")
        return None

    def _holder(self) -> Any:
        """The c10d handler's synced shared state (``.state``), or None for other handlers."""
        return getattr(self._handler, "_state_holder", None)

    @property
    def round(self) -> int | None:
        """The round this node last joined (c10d), else None."""
        return self._round

    def nodes(self) -> list[str] | None:
        """The names (``host:pid``, trainer.ledger) of the round's nodes in node order (c10d);
        None with a handler that does not tell."""
        if isinstance(self._handler, KeyedRendezvousHandler):
            return self._handler.nodes()
        state = getattr(self._holder(), "state", None)
        if state is None:
            return None
        ranked = sorted(state.participants.items(), key=lambda item: item[1])
        return [f"{desc.addr}:{desc.pid}" for desc, _ in ranked]

    def this_node(self) -> str:
        if isinstance(self._handler, KeyedRendezvousHandler):
            return self._handler.this_node()
        node = getattr(self._handler, "_this_node", None)
        return ledger.node_name() if node is None else f"{node.addr}:{node.pid}"


def method_name(depth: int = 2) -> str:
    """torch's ``dynamic_rendezvous.get_method_name``, the same name without its two
    ``inspect.stack()`` calls, which read the source lines of every frame on the stack: c10d's
    handler names each operation it records so, a keep-alive every 5 s included (py-spy: a
    tenth of the agent's CPU in a 10-step run, a fifth of what was not torch's import)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack not that deep, as torch's says
        return "no_method_name"


dynamic_rendezvous.get_method_name = method_name


def watched(spec: agent_api.WorkerSpec) -> MembershipWatch:
    """The agent's handler for ``spec``: its rendezvous handler watched, torchrun's static one
    first given a round per attempt (torchjob.trainer.static_rounds)."""
    return MembershipWatch(rounded(spec))

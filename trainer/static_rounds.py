"""torchrun's ``static`` rendezvous (a fixed ``--nnodes`` with ``--master-addr``: Kubeflow's
fixed-size PyTorchJob, TrainJob's torch plugin, a hand-written ``srun``) made safe to restart
across nodes: every attempt is a round that all nodes join before any worker starts, the
agents' keys live under the round's prefix, and node 0 gives the round's workers a fresh port
for their own store. Node ranks stay ``--node-rank``'s. Why torch's own handler cannot restart
(the last attempt's keys, nodes drifting an attempt apart): docs/internals.md.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from torch.distributed import PrefixStore, Store
from torch.distributed.elastic.rendezvous import (RendezvousInfo, RendezvousStoreInfo,
                                                  RendezvousTimeoutError)

PREFIX = "torchjob.static."
LATEST_KEY = PREFIX + "latest"  # the newest round a node joined
POLL_S = (0.05, 0.5)  # a node's look at its round's count: first and longest interval


class StaticRounds:
    """``handler`` (torch's StaticTCPRendezvous of more than one node) with a round per
    attempt (see the module's docstring); everything else goes to the handler unchanged."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler
        self._next = 0  # the round this node joins next, at least

    def __getattr__(self, name: str) -> object:
        return getattr(self._handler, name)

    @property
    def use_agent_store(self) -> bool:
        """False: the workers' store is their rank 0's, on the round's port (a shared one
        would keep the last attempt's keys)."""
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        info = self._handler.next_rendezvous()  # the job's store (made once), node 0 hosts it
        rank, size = info.rank, info.world_size
        round_ = self.join(info.store, size)
        store = PrefixStore(f"{PREFIX}round{round_}.", info.store)
        # node 0 is at master_addr (it hosts the job's store there): its workers' store too
        bootstrap = RendezvousStoreInfo.build(rank, store, self._handler.master_addr)
        return RendezvousInfo(store, rank, size, bootstrap)

    def join(self, store: Store, size: int) -> int:
        """Meet the other nodes in this attempt's round; its number. A node that comes back
        (a restarted agent) after its round was full joins the next one, where the others come
        once their workers have failed without it."""
        timeout: timedelta = self._handler.timeout
        deadline = time.monotonic() + timeout.total_seconds()
        latest = store.get(LATEST_KEY).decode() if store.check([LATEST_KEY]) else ""
        round_ = max(self._next, int(latest or 0))
        while store.add(f"{PREFIX}round{round_}", 1) > size:
            round_ += 1
        mine = str(round_)
        while latest != mine and (not latest or int(latest) < round_):  # only ever raised
            latest = store.compare_set(LATEST_KEY, latest, mine).decode()
        pause, joined = POLL_S[0], 0
        while (joined := store.add(f"{PREFIX}round{round_}", 0)) < size:
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"static rendezvous: {joined} of {size} nodes came to round {round_} within "
                    f"{timeout.total_seconds():g} s (each restart is a round all nodes join): "
                    "check that every node's agent is still running")
            time.sleep(pause)
            pause = min(pause * 2, POLL_S[1])
        self._next = round_ + 1
        return round_


def rounded(spec: Any) -> Any:
    """``spec``'s rendezvous handler, in StaticRounds when it is torchrun's static one of more
    than one node (the spec's fixed master address and port then go: each round gives them)."""
    handler = spec.rdzv_handler
    if handler.get_backend() != "static" or getattr(handler, "world_size", 1) <= 1:
        return handler
    spec.master_addr = spec.master_port = None
    return StaticRounds(handler)

"""StaticRounds.join on a real TCPStore: the nodes of an attempt meet in one round, a node that
comes back after its round filled joins the next, and a node left alone says who is missing."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

from torchjob.trainer.static_rounds import StaticRounds, rounded


def node(timeout_s: float = 30) -> StaticRounds:
    return StaticRounds(SimpleNamespace(timeout=timedelta(seconds=timeout_s),
                                        master_addr="127.0.0.1"))


def together(store: TCPStore, nodes: list[StaticRounds], size: int) -> list[Any]:
    """Each of ``nodes`` joins at once: the rounds (or errors) they got, in order."""
    got: list[Any] = [None] * len(nodes)

    def join(i: int) -> None:
        try:
            got[i] = nodes[i].join(store, size)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            got[i] = exc
    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return got


@pytest.fixture
def store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)


def test_each_attempt_is_a_round_every_node_joins(store: TCPStore) -> None:
    a, b = node(), node()
    assert together(store, [a, b], 2) == [0, 0]
    assert together(store, [a, b], 2) == [1, 1]


def test_a_node_back_after_its_round_filled_joins_the_next(store: TCPStore) -> None:
    a, b = node(), node()
    assert together(store, [a, b], 2) == [0, 0]
    back = node()  # b's agent started again: it counts from 0
    assert together(store, [back, a], 2) == [1, 1]


def test_a_node_alone_says_how_many_came(store: TCPStore) -> None:
    got = together(store, [node(timeout_s=0.5)], 2)[0]
    assert isinstance(got, RendezvousTimeoutError)
    assert "1 of 2 nodes came to round 0" in str(got)


def test_only_static_handlers_of_several_nodes_get_rounds() -> None:
    def spec(backend: str, world_size: int) -> SimpleNamespace:
        handler = SimpleNamespace(get_backend=lambda: backend, world_size=world_size)
        return SimpleNamespace(rdzv_handler=handler, master_addr="h", master_port=1)
    for kept in (spec("static", 1), spec("c10d", 2)):
        assert rounded(kept) is kept.rdzv_handler and kept.master_port == 1
    several = spec("static", 2)
    assert isinstance(rounded(several), StaticRounds)
    assert several.master_addr is None and several.master_port is None  # each round's own

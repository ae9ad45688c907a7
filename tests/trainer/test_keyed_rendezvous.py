"""The keyed rendezvous (trainer/rendezvous.py): nodes as threads, each its own client of one
real TCPStore, as agents are of the job's store."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import (RendezvousClosedError, RendezvousInfo,
                                                  RendezvousParameters, RendezvousTimeoutError)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from torchjob.trainer.rendezvous import NAME, KeyedRendezvousHandler

DEADLINE_S = 60.0


HANDLERS: list[KeyedRendezvousHandler] = []


@pytest.fixture
def server() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    yield store
    while HANDLERS:  # their heartbeats end before the store does
        HANDLERS.pop()._stop_heartbeat()
    del store


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


def node(server: TCPStore, min_nodes: int, max_nodes: int, **settings: Any
         ) -> KeyedRendezvousHandler:
    client = TCPStore("127.0.0.1", server.port, is_master=False,
                      timeout=timedelta(seconds=DEADLINE_S))
    settings.setdefault("join_timeout", DEADLINE_S)
    handler = KeyedRendezvousHandler(client, "job", min_nodes, max_nodes,
                                     local_addr="127.0.0.1", **settings)
    HANDLERS.append(handler)
    return handler


def joined(futures: list[Future[RendezvousInfo]]) -> list[tuple[int, int]]:
    return [(info.rank, info.world_size) for info in (f.result(DEADLINE_S) for f in futures)]


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S:g} s"
        time.sleep(0.05)


def test_nodes_form_one_group_ranked_by_join_order_and_traffic_is_per_node_keys(
        server: TCPStore, pool: ThreadPoolExecutor) -> None:
    """Six nodes, min 4 max 8: one round of six (the last call gives the late ones time),
    ranks 0..5 once each; each node's names in rank order; a round's store is c10d's prefix."""
    nodes = [node(server, 4, 8, last_call_timeout=2) for _ in range(6)]
    got = joined([pool.submit(n.next_rendezvous) for n in nodes])
    assert sorted(got) == [(rank, 6) for rank in range(6)]
    assert {n.round for n in nodes} == {0}
    names = nodes[0].nodes()
    assert len(names) == 6 and all(name.startswith("127.0.0.1:") for name in names)
    assert server.get("torch.rendezvous.job.0/MASTER_ADDR") == b"127.0.0.1"
    assert all(n.num_nodes_waiting() == 0 for n in nodes)


def test_max_nodes_close_the_round_without_the_last_call(server: TCPStore,
                                                         pool: ThreadPoolExecutor) -> None:
    """At max_nodes the round closes at once: a last call of 600 s is not waited for."""
    nodes = [node(server, 1, 3, last_call_timeout=600) for _ in range(3)]
    assert sorted(joined([pool.submit(n.next_rendezvous) for n in nodes])) == \
        [(0, 3), (1, 3), (2, 3)]


def test_new_nodes_wait_for_the_running_group_and_join_it_at_its_restart(
        server: TCPStore, pool: ThreadPoolExecutor) -> None:
    """Two nodes train (min 2, max 4); two new ones never form a group of their own beside it,
    though they are min_nodes; the running nodes see them waiting, restart, and all four form
    round 1."""
    members = [node(server, 2, 4, last_call_timeout=3) for _ in range(2)]
    assert sorted(joined([pool.submit(n.next_rendezvous) for n in members])) == [(0, 2), (1, 2)]
    new = [node(server, 2, 4, last_call_timeout=3) for _ in range(2)]
    waiting = [pool.submit(n.next_rendezvous) for n in new]
    wait_for(lambda: members[0].num_nodes_waiting() == 2, "two nodes waiting")
    time.sleep(3 + 1)  # past their last call: still no round of their own
    assert not server.check(["torchjob.rdzv.job/r1/size"]) and not any(f.done() for f in waiting)
    again = [pool.submit(n.next_rendezvous) for n in members]
    got = joined(waiting + again)
    assert sorted(got) == [(rank, 4) for rank in range(4)]
    assert {n.round for n in members + new} == {1}


def test_a_new_node_forms_the_next_round_once_every_member_is_gone(
        server: TCPStore, pool: ThreadPoolExecutor) -> None:
    """The group's members all died (their heartbeats stopped): a new node does not wait for
    them forever; it opens the next round and forms it."""
    quick = {"keep_alive_interval": 0.2, "keep_alive_max_attempt": 2, "last_call_timeout": 1}
    members = [node(server, 1, 2, **quick) for _ in range(2)]
    assert sorted(joined([pool.submit(n.next_rendezvous) for n in members])) == [(0, 2), (1, 2)]
    for member in members:
        member._stop_heartbeat()
    new = node(server, 1, 2, **quick)
    assert joined([pool.submit(new.next_rendezvous)]) == [(0, 1)]
    assert new.round == 1


def test_a_round_whose_member_died_before_it_closed_is_abandoned_for_the_next(
        server: TCPStore, pool: ThreadPoolExecutor) -> None:
    """A node joined (counted) and died before the round closed: the round closes with it, its
    living members wait a keep-alive interval times its attempts for it to begin, abandon it,
    and form the next round without it (torch's agent would have waited for the dead node's
    ranks until the store's timeout and failed the job)."""
    quick = {"keep_alive_interval": 0.3, "keep_alive_max_attempt": 2, "last_call_timeout": 1}
    ghost = TCPStore("127.0.0.1", server.port, is_master=False)
    assert ghost.add("torchjob.rdzv.job/r0/count", 1) == 1  # joined, then died: nothing more
    ghost.set("torchjob.rdzv.job/r0/node/0", "ghost:1")
    living = [node(server, 2, 4, **quick) for _ in range(2)]
    got = joined([pool.submit(n.next_rendezvous) for n in living])
    assert sorted(got) == [(0, 2), (1, 2)]
    assert {n.round for n in living} == {1}
    assert server.get("torchjob.rdzv.job/r0/size") == b"3"
    assert server.get("torchjob.rdzv.job/r0/begun") == b"abandoned"
    assert server.get("torchjob.rdzv.job/r1/begun") == b"1"
    assert "ghost:1" not in living[0].nodes()


def test_closing_ends_the_waiting_nodes_and_later_joins(server: TCPStore,
                                                        pool: ThreadPoolExecutor) -> None:
    members = [node(server, 1, 2, last_call_timeout=1) for _ in range(2)]
    joined([pool.submit(n.next_rendezvous) for n in members])
    new = node(server, 1, 2, last_call_timeout=1)
    waiting = pool.submit(new.next_rendezvous)
    wait_for(lambda: server.check(["torchjob.rdzv.job/r1/count"]), "the new node's join")
    assert members[0].shutdown() and members[0].is_closed()
    with pytest.raises(RendezvousClosedError):
        waiting.result(DEADLINE_S)
    with pytest.raises(RendezvousClosedError):
        node(server, 1, 2).next_rendezvous()


def test_too_few_nodes_time_out_saying_how_many_joined(server: TCPStore) -> None:
    with pytest.raises(RendezvousTimeoutError, match=r"1 node\(s\) joined, 2 needed"):
        node(server, 2, 2, join_timeout=1).next_rendezvous()


def test_torch_launcher_finds_the_backend_by_name(server: TCPStore) -> None:
    """The ``torchrun.handlers`` entry point: torch's registry builds it from torchrun's
    parameters, a client of the store at the endpoint."""
    params = RendezvousParameters(NAME, f"127.0.0.1:{server.port}", "job", 1, 1,
                                  is_host="false", last_call_timeout="1")
    handler = get_rendezvous_handler(params)
    assert isinstance(handler, KeyedRendezvousHandler) and handler.get_backend() == NAME
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert handler.shutdown()

"""``rdzv.backend: torchjob``: an elastic rendezvous whose store traffic per node stays O(1) as
the job grows, on the store and settings c10d's uses (torch's launcher finds it by name).

Each node's part is a key of its own, numbered by one atomic counter per round, where c10d
rewrites one pickled state of every node by compare-and-set. A round's keys, who closes it,
when a next round may form, and what is not kept from c10d: docs/internals.md ("The keyed
rendezvous").
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from torch.distributed import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import (RendezvousClosedError, RendezvousHandler,
                                                  RendezvousInfo, RendezvousParameters,
                                                  RendezvousStoreInfo, RendezvousTimeoutError)

log = logging.getLogger(__name__)

NAME = "torchjob"  # the --rdzv-backend value
CLOSED_SIZE = "0"  # a round's size once the job closed before it formed
BEGUN, ABANDONED = "1", "abandoned"  # a closed round's begun: every member there, or not
NODES_WAITING_CACHE_S = 1.0  # as c10d's state cache: the monitor asks every 0.1 s
POLL_S = (0.05, 0.5)  # a closer's poll of its round, first and longest interval
_BEATING: set[threading.Event] = set()  # the heartbeats running: stopped at exit


@atexit.register
def _stop_heartbeats() -> None:
    for stop in list(_BEATING):
        stop.set()


class KeyedRendezvousHandler(RendezvousHandler):
    """The handler (see the module's docstring); ``store`` is the job's rendezvous store."""

    def __init__(self, store: Store, run_id: str, min_nodes: int, max_nodes: int, *,
                 local_addr: str | None = None, join_timeout: float = 600.0,
                 last_call_timeout: float = 30.0, keep_alive_interval: float = 5.0,
                 keep_alive_max_attempt: int = 3) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"the rendezvous needs 1 <= min_nodes ({min_nodes}) <= "
                             f"max_nodes ({max_nodes})")
        self._store, self._run_id = store, run_id
        self._keys = PrefixStore(f"torchjob.rdzv.{run_id}", store)
        self._min, self._max = min_nodes, max_nodes
        self._addr = local_addr or socket.getfqdn()
        self._join_s, self._last_call_s = join_timeout, last_call_timeout
        self._keep_alive_s, self._max_attempt = keep_alive_interval, keep_alive_max_attempt
        self._round: int | None = None  # the round this node last joined
        self._rank = self._size = 0
        self._waiting: tuple[float, int] | None = None  # num_nodes_waiting's cached answer
        self._heartbeat: threading.Event | None = None
        self._server: TCPStore | None = None  # rank 0's store for the workers

    # -- the handler's interface ------------------------------------------------------------

    def get_backend(self) -> str:
        return NAME

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return os.getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1"

    def next_rendezvous(self) -> RendezvousInfo:
        self._stop_heartbeat()
        deadline = time.monotonic() + self._join_s
        latest = self._latest()
        round_ = latest + 1 if self._round is None else max(self._round + 1, latest + 1)
        member = self._round is not None  # of the last round: the next one may form
        while True:
            joined = self._join(round_, deadline, member)
            if isinstance(joined, tuple):
                break
            member = member or joined == ABANDONED  # it never ran: the next one may form
            round_ += 1
        self._round, (self._rank, self._size) = round_, joined
        self._waiting = None
        self._start_heartbeat()
        log.info("node %s joined round %d of rendezvous %r as rank %d of %d", self.this_node(),
                 round_, self._run_id, self._rank, self._size)
        store = PrefixStore(f"torch.rendezvous.{self._run_id}.{round_}", self._store)
        return RendezvousInfo(store, self._rank, self._size, self._bootstrap_info(store))

    def is_closed(self) -> bool:
        return self._keys.check(["closed"])

    def set_closed(self) -> None:
        self._keys.set("closed", "1")
        latest = self._latest()  # a node waiting for a round not yet formed: it ends too
        for round_ in (latest + 1, latest + 2):
            self._keys.compare_set(f"r{round_}/size", "", CLOSED_SIZE)

    def num_nodes_waiting(self) -> int:
        """The nodes that joined the next round (new ones, or members that restarted), read
        at most once a second; none while the group is at ``max_nodes``."""
        if self._round is None or self._size >= self._max:
            return 0
        now = time.monotonic()
        if self._waiting is None or now - self._waiting[0] >= NODES_WAITING_CACHE_S:
            self._waiting = (now, self._keys.add(f"r{self._round + 1}/count", 0))
        return self._waiting[1]

    def shutdown(self) -> bool:
        self._stop_heartbeat()
        try:
            self.set_closed()
        except Exception as exc:  # the store's host may be gone as the job ends
            log.warning("could not close rendezvous %r: %s", self._run_id, exc)
            return False
        return True

    # -- what MembershipWatch and the ledger read -------------------------------------------

    @property
    def round(self) -> int | None:
        return self._round

    def nodes(self) -> list[str]:
        """The names of this round's nodes in rank order (one read of every name)."""
        keys = [f"r{self._round}/node/{rank}" for rank in range(self._size)]
        return [name.decode() for name in self._keys.multi_get(keys)] if keys else []

    def this_node(self) -> str:
        return f"{self._addr}:{os.getpid()}"

    # -- joining ----------------------------------------------------------------------------

    def _latest(self) -> int:
        return int(self._keys.get("latest")) if self._keys.check(["latest"]) else -1

    def _join(self, round_: int, deadline: float, member: bool) -> tuple[int, int] | str | None:
        """Join ``round_``: (rank, size) once it closed with this node in it and began; None
        when it closed without this node, ABANDONED when a member of it never came to begin
        it (either way: join the next). A ``member`` of the last round opens this one, once
        counted in it."""
        key = f"r{round_}"  # (a closed job closed the rounds not yet formed: CLOSED_SIZE)
        count = self._keys.add(f"{key}/count", 1)
        self._keys.set(f"{key}/node/{count - 1}", self.this_node())
        if member:
            self._keys.set(f"{key}/open", "1")
        joined = time.monotonic()
        if count == self._max:
            self._close(round_, self._max)
        elif count >= self._min:
            self._close_after_last_call(round_, joined, deadline)
        size = self._size_of(round_, deadline)
        if size == CLOSED_SIZE.encode():
            raise RendezvousClosedError(f"the rendezvous {self._run_id!r} is closed")
        if count > int(size):
            return None
        return (count - 1, int(size)) if self._begin(round_, int(size)) else ABANDONED

    def _begin(self, round_: int, size: int) -> bool:
        """Whether every member of the closed round came to begin it: a node counted in it
        may have died before it closed (nothing watches a node that waits), and torch's
        agent would wait for its ranks until the store's timeout, then fail the job. The
        member that makes the count begins it; one that waited a keep-alive interval times
        its attempts without that abandons it: its members join the next round."""
        key = f"r{round_}/begun"
        if self._keys.add(f"r{round_}/ready", 1) == size:
            self._keys.compare_set(key, "", BEGUN)
        try:
            self._keys.wait([key], timedelta(seconds=self._keep_alive_s * self._max_attempt))
        except Exception:  # the timeout: whoever sets begun first decides, for every member
            self._keys.compare_set(key, "", ABANDONED)
        begun = self._keys.get(key)
        if begun != BEGUN.encode():
            log.warning("round %d of rendezvous %r was abandoned: %d of its %d node(s) came "
                        "to begin it; joining the next round", round_, self._run_id,
                        self._keys.add(f"r{round_}/ready", 0), size)
        return begun == BEGUN.encode()

    def _size_of(self, round_: int, deadline: float) -> bytes:
        """The round's size, waiting for it to close until ``deadline``."""
        key = f"r{round_}/size"
        left = deadline - time.monotonic()
        try:  # at once when it exists
            self._keys.wait([key], timedelta(seconds=max(0.001, left)))
        except Exception as exc:
            raise RendezvousTimeoutError(
                f"round {round_} of rendezvous {self._run_id!r} did not form within "
                f"join_timeout ({self._join_s:g} s): {self._keys.add(f'r{round_}/count', 0)} "
                f"node(s) joined, {self._min} needed: raise rdzv.join_timeout, or lower "
                "nnodes' MIN") from exc
        return self._keys.get(key)

    def _close_after_last_call(self, round_: int, joined: float, deadline: float) -> None:
        """As a node at or past ``min_nodes``: close the round at ``last_call_timeout`` after
        this node joined (once the round may form), unless another node closed it first."""
        key, pause = f"r{round_}", POLL_S[0]
        opened = joined if round_ == 0 or self._keys.check([f"{key}/open"]) or \
            self._abandoned(round_ - 1) else None
        alive: tuple[float, list[bytes]] | None = None  # the last round's heartbeats, seen
        while time.monotonic() < deadline:
            if self._keys.check([f"{key}/size"]):
                return
            now = time.monotonic()
            if opened is None and self._keys.check([f"{key}/open"]):
                opened = now
            elif opened is None and (alive is None or
                                     now - alive[0] >= self._keep_alive_s * self._max_attempt):
                beats = self._heartbeats(round_ - 1)
                if alive is not None and beats == alive[1]:  # every member of it is gone
                    self._keys.set(f"{key}/open", "1")
                    opened = now
                alive = (now, beats)
            if opened is not None and now - max(opened, joined) >= self._last_call_s:
                self._close(round_, min(self._max, self._keys.add(f"{key}/count", 0)))
                return
            time.sleep(pause)
            pause = min(POLL_S[1], pause * 1.5)

    def _abandoned(self, round_: int) -> bool:
        return self._keys.check([f"r{round_}/begun"]) and \
            self._keys.get(f"r{round_}/begun") == ABANDONED.encode()

    def _heartbeats(self, round_: int) -> list[bytes]:
        """The heartbeat counters of ``round_``'s members (unchanged over a keep-alive interval
        times its attempts: every member is gone); b"" for one that never beat (it died
        before, or has not yet begun: read one by one, never waited for)."""
        size = int(self._keys.get(f"r{round_}/size"))
        keys = [f"r{round_}/alive/{rank}" for rank in range(size)]
        if not keys or self._keys.check(keys):
            return self._keys.multi_get(keys) if keys else []
        return [self._keys.get(k) if self._keys.check([k]) else b"" for k in keys]

    def _close(self, round_: int, size: int) -> None:
        current = self._keys.compare_set(f"r{round_}/size", "", str(size))
        if current == str(size).encode():
            latest = self._latest()
            while latest < round_:  # rounds close in order; a slow closer must not go back
                now = self._keys.compare_set("latest", str(latest) if latest >= 0 else "",
                                             str(round_))
                latest = int(now)

    # -- a member's heartbeat, and rank 0's store for the workers ----------------------------

    def _start_heartbeat(self) -> None:
        stop, key = threading.Event(), f"r{self._round}/alive/{self._rank}"
        self._keys.add(key, 1)

        def beat() -> None:
            while not stop.wait(self._keep_alive_s):
                try:
                    self._keys.add(key, 1)
                except Exception as exc:  # the store gone: the workers' failure says more
                    log.debug("heartbeat of %s: %s", key, exc)
        self._heartbeat = stop
        _BEATING.add(stop)
        threading.Thread(target=beat, name="torchjob-rdzv-heartbeat", daemon=True).start()

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.set()
            _BEATING.discard(self._heartbeat)
            self._heartbeat = None

    def _bootstrap_info(self, store: Store) -> RendezvousStoreInfo:
        """Where the workers' store is: as c10d's, rank 0's agent serves it (shared once made,
        kept across rounds while this node stays rank 0)."""
        if not self.use_agent_store:
            return RendezvousStoreInfo.build(self._rank, store, local_addr=self._addr)
        port = 0  # rank 0's; another rank reads it from the round's store
        if self._rank == 0:
            if self._server is None:
                self._server = TCPStore(self._addr, 0, is_master=True, multi_tenant=True)
            port = self._server.port
        return RendezvousStoreInfo.build(self._rank, store, local_addr=self._addr,
                                         server_port=port)


def create_handler(params: RendezvousParameters) -> KeyedRendezvousHandler:
    """The registry's factory: the c10d backend's store (``rdzv_endpoint``, ``is_host``) and
    its settings' names and defaults."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import _create_tcp_store

    def number(key: str, default: float) -> float:
        value = params.get_as_int(key)
        return float(default if value is None else value)

    return KeyedRendezvousHandler(
        _create_tcp_store(params), params.run_id, params.min_nodes, params.max_nodes,
        local_addr=params.local_addr, join_timeout=number("join_timeout", 600),
        last_call_timeout=number("last_call_timeout", 30),
        keep_alive_interval=number("keep_alive_interval", 5),
        keep_alive_max_attempt=int(number("keep_alive_max_attempt", 3)))


def creator() -> Any:
    """The ``torchrun.handlers`` entry point (pyproject.toml): torch's launcher, torchrun's
    included, knows ``--rdzv-backend torchjob`` wherever this package is installed."""
    return create_handler

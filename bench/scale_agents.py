"""One host of bench/scale.py: COUNT simulated rendezvous agents as threads of this process,
no workers. Each runs the real code: for ours the kit's keyed rendezvous (``rdzv.backend:
torchjob``, trainer/rendezvous.py) wrapped in MembershipWatch, a client of the job's own store;
for torch's stock its c10d handler (``create_backend``, ``create_handler``), one agent hosting
the TCPStore; for "store" the same c10d handler, a client of the job's own store. Commands
come one a line on stdin; each answer is one JSON line on stdout (``say``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (_create_tcp_store,
                                                                          create_backend)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from torchjob.trainer.failures import RESTARTING, Verdict
from torchjob.trainer.membership import MembershipWatch
from torchjob.trainer.rendezvous import KeyedRendezvousHandler
from torchjob.trainer.round_verdict import RoundVerdict

MONITOR_INTERVAL_S = 0.1  # the agent's --monitor-interval (jobs/command.py; torchrun's default)
JOIN_TIMEOUT_S = 600  # the kit's rdzv.join_timeout default (jobs/spec.py)
SETUP_THREADS = 32  # clients connecting at once in a host: each takes ~0.2 s here
FQDN = socket.getfqdn()  # what each handler would look up for itself (local_addr unset)


def rss(pid: int | str = "self") -> int:
    """A process's resident memory in bytes (/proc)."""
    with open(f"/proc/{pid}/status") as status:
        line = next(ln for ln in status if ln.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def cpu_s(pid: int | str = "self") -> float:
    """A process's CPU time so far, user and system, in seconds (/proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def size(value: Any) -> int:
    return len(value) if isinstance(value, (bytes, str)) else 0


class Counted(dist.Store):
    """An agent's store: forwards every operation and counts it, and the bytes of the values
    it sends and receives (keys not counted)."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner, self.ops, self.bytes = inner, 0, 0
        self.by_op: dict[str, int] = {}  # the same, by operation

    def _count(self, op: str, result: Any, *sent: Any) -> Any:
        self.ops += 1
        self.by_op[op] = self.by_op.get(op, 0) + 1
        self.bytes += size(result) + sum(size(v) for v in sent)
        return result

    def set(self, key: str, value: Any) -> None:
        self._count("set", self.inner.set(key, value), value)

    def get(self, key: str) -> bytes:
        return self._count("get", self.inner.get(key))

    def add(self, key: str, amount: int) -> int:
        return self._count("add", self.inner.add(key, amount))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._count("compare_set", self.inner.compare_set(key, expected, desired),
                           expected, desired)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = self.inner.multi_get(keys)
        return self._count("multi_get", values, *values)

    def check(self, keys: list[str]) -> bool:
        return self._count("check", self.inner.check(keys))

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self._count("wait", self.inner.wait(keys) if timeout is None
                    else self.inner.wait(keys, timeout))

    def delete_key(self, key: str) -> bool:
        return self._count("delete_key", self.inner.delete_key(key))

    def num_keys(self) -> int:
        return self._count("num_keys", self.inner.num_keys())

    def set_timeout(self, timeout: Any) -> None:
        self.inner.set_timeout(timeout)

    @property
    def timeout(self) -> Any:
        return self.inner.timeout


class SimAgent:
    """One agent's rendezvous, as torchrun's launcher builds it from its arguments."""

    def __init__(self, index: int, args: argparse.Namespace) -> None:
        side, nodes = args.side, args.nodes
        hosts = side == "torch" and index == 0  # torch's: the first agent serves the store
        params = RendezvousParameters(
            "c10d", args.endpoint, args.run_id, min_nodes=max(1, nodes - 1), max_nodes=nodes,
            local_addr=FQDN, join_timeout=str(JOIN_TIMEOUT_S),
            last_call_timeout=str(args.last_call), keep_alive_interval=str(args.keep_alive),
            keep_alive_max_attempt=str(args.max_attempt), is_host="true" if hosts else "false")
        self.index, self.alive, self.info, self.done = index, True, None, 0.0
        self.keyed = side == "ours"
        if self.keyed:
            self.store = Counted(_create_tcp_store(params))
            self.handler: Any = MembershipWatch(KeyedRendezvousHandler(
                self.store, args.run_id, max(1, nodes - 1), nodes, local_addr=FQDN,
                join_timeout=JOIN_TIMEOUT_S, last_call_timeout=args.last_call,
                keep_alive_interval=args.keep_alive, keep_alive_max_attempt=args.max_attempt))
            return
        backend, store = create_backend(params)  # its first compare_set is not counted: +1
        self.store = Counted(store)
        self.store.ops = 1
        backend._store = self.store
        self.handler = create_handler(self.store, backend, params)

    @property
    def round(self) -> int:
        return self.handler.round if self.keyed else self.handler._state_holder.state.round

    def stop_heartbeats(self) -> None:
        if self.keyed:
            self.handler._stop_heartbeat()
        else:
            self.handler._stop_heartbeats()

    def rendezvous(self) -> None:
        self.info = self.handler.next_rendezvous()
        self.done = time.time()


def each(agents: list[SimAgent], work: Callable[[SimAgent], Any]) -> list[str]:
    """``work`` on every live agent at once, a thread each; the errors, as lines."""
    live = [a for a in agents if a.alive]
    if not live:
        return []
    with ThreadPoolExecutor(max_workers=len(live)) as pool:
        futures = [(a, pool.submit(work, a)) for a in live]
    return [f"agent {a.index}: {type(f.exception()).__name__}: {f.exception()}"
            for a, f in futures if f.exception() is not None]


def totals(agents: list[SimAgent], **extra: Any) -> dict[str, Any]:
    """The counters of the live agents, then zeroed."""
    live = [a for a in agents if a.alive]
    by_op: dict[str, int] = {}
    for a in live:
        for op, count in a.store.by_op.items():
            by_op[op] = by_op.get(op, 0) + count
    out = {"ops": sum(a.store.ops for a in live), "bytes": sum(a.store.bytes for a in live),
           "max_ops": max((a.store.ops for a in live), default=0), "agents": len(live),
           "by_op": by_op, "rss": rss(), "cpu_s": cpu_s(), **extra}
    for a in agents:
        a.store.ops = a.store.bytes = 0
        a.store.by_op = {}
    return out


def form(agents: list[SimAgent]) -> dict[str, Any]:
    """Every live agent through ``next_rendezvous`` at once: when each came back, and where."""
    totals(agents)
    errors = each(agents, SimAgent.rendezvous)
    live = [a for a in agents if a.alive and a.info is not None]
    return totals(agents, errors=errors, done=[a.done for a in live],
                  world=sorted({a.info.world_size for a in live}),
                  rounds=sorted({a.round for a in live}))


def steady(agents: list[SimAgent], seconds: float) -> dict[str, Any]:
    """The formed group's own traffic for ``seconds``: the keep-alive timers, and the agent's
    monitor loop asking ``num_nodes_waiting`` every ``MONITOR_INTERVAL_S``."""
    totals(agents)
    began, sweeps, late = time.monotonic(), 0, 0
    while time.monotonic() - began < seconds:
        start = time.monotonic()
        for a in agents:
            if a.alive:
                a.handler.num_nodes_waiting()
        sweeps += 1
        spent = time.monotonic() - start
        late += spent > MONITOR_INTERVAL_S
        time.sleep(max(0.0, MONITOR_INTERVAL_S - spent))
    return totals(agents, window_s=time.monotonic() - began, sweeps=sweeps, late_sweeps=late)


def verdict(agents: list[SimAgent], nodes: int) -> dict[str, Any]:
    """A hang's verdict exchanged as the kit's agents do (trainer.round_verdict): agent 0 says
    restart, the rest hear."""
    totals(agents)
    said = Verdict(True, None, f"no progress for 60 s (simulated hang){RESTARTING}")
    heard: list[bool] = []

    def exchange(a: SimAgent) -> None:
        mine = said if a.index == 0 else Verdict(None, None, "a peer was lost")
        heard.append(bool(RoundVerdict(a.info.store, nodes, a.index).share(mine).restart))

    errors = each(agents, exchange)
    return totals(agents, errors=errors, restarts=sum(heard))


def kill(agents: list[SimAgent], index: int) -> dict[str, Any]:
    """Agent ``index`` dies: its heartbeats stop, it takes no further part."""
    for a in agents:
        if a.index == index:
            a.stop_heartbeats()
            a.alive = False
    return {"killed": index}


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def serve(agents: list[SimAgent], nodes: int) -> None:
    """Answer commands from stdin until ``quit`` (or its end)."""
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "quit":
            return
        if cmd in ("form", "reform"):
            say(cmd, **form(agents))
        elif cmd == "steady":
            say(cmd, **steady(agents, float(args[0])))
        elif cmd == "verdict":
            say(cmd, **verdict(agents, nodes))
        elif cmd == "kill":
            say(cmd, **kill(agents, int(args[0])))
        else:
            say("error", error=f"unknown command {cmd!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", choices=("ours", "torch", "store"), required=True,
                    help="store: torch's handler on ours' store process (bench/scale.py's "
                    "decomposition)")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--nodes", type=int, required=True, help="N, the whole group")
    ap.add_argument("--first", type=int, required=True, help="this host's first agent")
    ap.add_argument("--count", type=int, required=True, help="this host's agents")
    ap.add_argument("--keep-alive", type=int, default=5, help="keep_alive_interval, s")
    ap.add_argument("--max-attempt", type=int, default=3, help="keep_alive_max_attempt")
    ap.add_argument("--last-call", type=int, default=2, help="last_call_timeout, s")
    args = ap.parse_args()
    say("up", rss=rss(), pid=os.getpid())
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=SETUP_THREADS) as pool:  # each client connects in
        agents = list(pool.map(lambda i: SimAgent(i, args),
                               range(args.first, args.first + args.count)))
    say("ready", rss=rss(), setup_s=time.monotonic() - began, threads=threading.active_count())
    try:
        serve(agents, args.nodes)
    finally:
        sys.stdout.flush()
        os._exit(0)  # no goodbyes: the clients' destructors and timers need not run


if __name__ == "__main__":
    main()

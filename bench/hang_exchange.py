"""The hang watchdog's store traffic at N nodes, measured: N real Watchdogs (trainer/hang.py),
one per simulated node with one rank each, over one real TCPStore served in this process (one
client; every operation counted per node), on a simulated clock of 1 s ticks.

Each tick writes every rank's progress record (trainer/progress.py's format) and polls every
node's watchdog. The group progresses for ``HEALTHY_S`` (a new collective each tick), then one
rank, drawn at random, stalls in its own code one collective behind while every other rank
waits inside the next one. Measured per N: store operations per node per second while healthy
and while stalled (median and max over nodes), node 0's operations to name the culprit, the
simulated seconds from the stall to the culprit's node acting, whether it named the right
rank, and the wall time of node 0's decision and of one node's poll (a real node polls only
itself; this one process polls all N in turn). N = TORCHJOB_BENCH_HANG (default
64,256,1024,4096).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import row  # noqa: E402

from torch.distributed import TCPStore  # noqa: E402

from torchjob.trainer.hang import Watchdog  # noqa: E402
from torchjob.trainer.progress import Record  # noqa: E402
from tests.procs import free_port  # noqa: E402

TIMEOUT_S = 20.0
HEALTHY_S = 10
OTHERS_FIRST_S = 10.0


class Counted:
    """One node's view of the shared store client: each operation counted."""

    def __init__(self, store: Any) -> None:
        self.store, self.ops = store, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.ops += 1
            return method(*args, **kwargs)
        return counted


def watchdogs(nodes: int, tmp: Path, now: list[float]) -> tuple[Any, list[Counted],
                                                                 list[Watchdog]]:
    """``nodes`` Watchdogs of one rank each (files under ``tmp``, clock ``now[0]``) over one
    client of a TCPStore served here: the server (hold it while they run), their stores."""
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=60))
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    stores, dogs = [], []
    for node in range(nodes):
        (tmp / str(node)).mkdir()
        stores.append(Counted(client))
        dog = Watchdog(tmp / str(node), TIMEOUT_S, others_first_s=OTHERS_FIRST_S,
                       say=lambda line: None, clock=lambda: now[0])
        dog.reset([(0, node, os.getpid())], node=node, nodes=nodes, store=stores[-1])
        dogs.append(dog)
    return server, stores, dogs


def trial(nodes: int) -> dict[str, Any]:
    """One simulated hang at ``nodes`` nodes; its figures."""
    culprit, now = random.randrange(nodes), [0.0]
    pid = os.getpid()
    with tempfile.TemporaryDirectory(prefix="torchjob-hangbench-") as tmp:
        server, stores, dogs = watchdogs(nodes, Path(tmp), now)
        healthy, stalled, acted, decided_ops = [], [], None, 0
        for tick in range(int(HEALTHY_S + TIMEOUT_S + OTHERS_FIRST_S + 5)):
            now[0] = float(tick)
            before = [s.ops for s in stores]
            seq = 10 + min(tick, HEALTHY_S)
            for node in range(nodes):
                behind = node == culprit and tick >= HEALTHY_S
                record = Record(beats=tick + 1, pid=pid, seq=seq - 1 if behind else seq,
                                in_collective=not behind and tick >= HEALTHY_S,
                                frame="train.py:9 in stuck" if behind else "")
                (Path(tmp) / str(node) / "0").write_bytes(record.encode())
            hangs, times = [], []
            for dog in dogs:
                started = time.perf_counter()
                hangs.append(dog.poll())
                times.append(time.perf_counter() - started)
            poll_s = (times[0], statistics.median(times))  # node 0's, a node's median
            ops = [s.ops - b for s, b in zip(stores, before)]
            (healthy if tick < HEALTHY_S else stalled).append((ops, poll_s))
            if dogs[0].finding is not None and not decided_ops:
                decided_ops = ops[0]
            acting = [n for n, h in enumerate(hangs) if h is not None]
            if acting:
                acted = (tick - HEALTHY_S, acting, [w.rank for w in hangs[acting[0]].stuck])
                break
    del stores, server
    flat = lambda samples: [o for ops, _ in samples for o in ops]  # noqa: E731
    return {"healthy": flat(healthy), "stalled": flat(stalled), "node0": decided_ops,
            "acted": acted, "culprit": culprit,
            "node0_poll_s": max(p[0] for _, p in stalled) if stalled else 0.0,
            "poll_s": max(p[1] for _, p in stalled) if stalled else 0.0}


def start_up(nodes: int) -> tuple[int, float]:
    """Every rank in a start-up longer than two timeouts (loading data; no collective yet, so
    no hang): the most store operations a node made in one second, and node 0's slowest
    poll (wall)."""
    now, pid, most, node0_s = [0.0], os.getpid(), 0, 0.0
    with tempfile.TemporaryDirectory(prefix="torchjob-hangbench-") as tmp:
        server, stores, dogs = watchdogs(nodes, Path(tmp), now)
        for tick in range(int(2 * TIMEOUT_S)):
            now[0] = float(tick)
            before = [s.ops for s in stores]
            for node in range(nodes):
                (Path(tmp) / str(node) / "0").write_bytes(
                    Record(beats=tick + 1, pid=pid, frame="train.py:3 in load").encode())
            for node, dog in enumerate(dogs):
                started = time.perf_counter()
                assert dog.poll() is None, "a start-up taken for a hang"
                if node == 0:
                    node0_s = max(node0_s, time.perf_counter() - started)
            most = max([most, *(s.ops - b for s, b in zip(stores, before))])
    del stores, server
    return most, node0_s


def run(quick: bool = False) -> list[dict[str, Any]]:
    sizes = [int(n) for n in os.environ.get("TORCHJOB_BENCH_HANG", "64,256,1024,4096")
             .split(",")]
    rows = []
    for nodes in sizes[:2] if quick else sizes:
        found = trial(nodes)
        acted = found["acted"]
        right = acted is not None and acted[1] == [found["culprit"]] and acted[2] == [
            found["culprit"]]
        name = f"hang watchdog, {nodes} nodes"
        rows += [
            row("hang", f"{name}: store ops per node per second, healthy (max)",
                max(found["healthy"]), None, "O(1)", "ops"),
            row("hang", f"{name}: store ops per node per second, stalled (median)",
                statistics.median(found["stalled"]), None, "O(1)", "ops"),
            row("hang", f"{name}: store ops per node per second, stalled (max but node 0)",
                max(found["stalled"]) if nodes == 1 else sorted(found["stalled"])[-2], None,
                "O(1)", "ops"),
            row("hang", f"{name}: node 0's store ops to name the culprit", found["node0"],
                None, "O(N), once", "ops"),
            row("hang", f"{name}: stall to the culprit's node acting (simulated)",
                acted[0] if acted else -1, None, f"{TIMEOUT_S:g} (the timeout)", "s"),
            row("hang", f"{name}: the drawn culprit named and acted on alone", int(right), None,
                "1", "yes/no"),
            row("hang", f"{name}: node 0's slowest poll (its decision; wall)",
                found["node0_poll_s"], None, "report", "s"),
            row("hang", f"{name}: a node's poll while stalled (median over nodes, slowest tick)",
                found["poll_s"], None, "report", "s"),
        ]
        most, node0_s = start_up(nodes)
        rows += [
            row("hang", f"{name}: store ops per node per second in a start-up of two timeouts "
                "(max)", most, None, "1 (a check)", "ops"),
            row("hang", f"{name}: node 0's slowest poll in that start-up (wall)", node0_s, None,
                "report", "s"),
        ]
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(f"{r['measure']}: {r['ours']} {r['unit']}")

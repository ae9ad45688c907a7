"""The scale benchmark's part of docs/benchmarks.md: a growth table per N, ours next to torch's,
a log-log plot (bench/results/scale.png) and the estimate of where the single store saturates,
all computed from the "scale" rows of latest.json (bench/scale.py writes them).
"""

from __future__ import annotations

import math
import re
from typing import Any

from common import RESULTS

PLOT = RESULTS / "scale.png"
KEEP_ALIVE_S = 5  # torch's keep_alive_interval, as bench/scale.py's Settings
# growth table column -> the end of the row's measure, and a scale for its figure
COLUMNS = {"formed (s)": ("group formed (median)", 1.0),
           "ops/s forming": ("store ops/s while forming", 1.0),
           "ops/agent to form": ("store ops per agent to form", 1.0),
           "steady ops/agent/interval": ("steady store ops per agent per keep-alive interval", 1.0),
           "store CPU (cores)": ("store server CPU, steady", 1.0),
           "serving RSS (MiB)": ("RSS of the process serving the store", 1.0),
           "client KiB/agent": ("client memory per agent", 1.0),
           "re-formed (s)": ("re-formed after one agent died (median)", 1.0)}


def by_size(rows: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """The scale rows as {N: {measure's end: row}}."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        m = re.match(r"(\d+) agents: (.*)", r["measure"])
        if r["benchmark"] == "scale" and m:
            out.setdefault(int(m.group(1)), {})[m.group(2)] = r
    return out


def fmt(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def growth_table(sizes: dict[int, dict[str, dict[str, Any]]]) -> str:
    """One line per N; each cell ``ours / torch's``."""
    head = "| N | " + " | ".join(COLUMNS) + " |\n|---|" + "---|" * len(COLUMNS) + "\n"
    lines = []
    for n, measures in sorted(sizes.items()):
        cells = []
        for end, _ in COLUMNS.values():
            r = measures.get(end)
            cells.append("not measured" if r is None else f"{fmt(r['ours'])} / {fmt(r['baseline'])}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def bytes_per_op(r: dict[str, Any]) -> float:
    samples = r.get("detail", {}).get("bytes_per_op", [])
    return sum(samples) / len(samples) if samples else 0.0


def costs(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """The state-cost rows, as (nodes, row), by nodes."""
    found = [(int(m.group(1)), r) for r in rows
             if (m := re.match(r"state of (\d+) nodes", r["measure"]))]
    return sorted(found, key=lambda item: item[0])


def saturation(rows: list[dict[str, Any]]) -> float | None:
    """The N where the heartbeats alone need more writes of the state per second than one
    store key can take one after another (1 / a write's time at N), log-log interpolated."""
    points = [(n, r["detail"]["heartbeat_writes_needed_per_s"],
               r["detail"]["serial_writes_possible_per_s"]) for n, r in costs(rows)]
    for (n1, need1, can1), (n2, need2, can2) in zip(points, points[1:]):
        if need1 < can1 and need2 >= can2:
            gap1, gap2 = math.log(can1 / need1), math.log(can2 / need2)
            return math.exp(math.log(n1) + (math.log(n2) - math.log(n1)) * gap1 / (gap1 - gap2))
    return None


def section(rows: list[dict[str, Any]]) -> str:
    """The scale section of docs/benchmarks.md."""
    sizes = by_size(rows)
    held = [n for n, m in sizes.items() if "group formed (median)" in m]
    failed = {n: m["not measured"]["detail"]["why"] for n, m in sizes.items()
              if "not measured" in m}
    cost_lines = "\n".join(
        f"| {n} | {r['detail']['state_bytes']} | {fmt(r['ours'])} | "
        f"{fmt(r['detail']['read_ms'])} | {fmt(r['detail']['heartbeat_writes_needed_per_s'])} | "
        f"{fmt(r['detail']['serial_writes_possible_per_s'])} |" for n, r in costs(rows))
    sat = saturation(rows)
    return (SECTION.format(plot=PLOT.relative_to(PLOT.parents[2]).as_posix())
            + growth_table(sizes)
            + f"\nHeld on this host: N = {', '.join(map(str, sorted(held)))}.\n"
            + "".join(f"\nNot measured at N = {n}: {why}\n" for n, why in sorted(failed.items()))
            + COST_HEAD + cost_lines + "\n"
            + ESTIMATE.format(sat=f"{sat:.0f}" if sat else "(beyond the sizes measured)")
            + LIMITS)


SECTION = """
## The rendezvous at scale (bench/scale.py)

`.venv/bin/python bench/run.py scale` reruns it alone. N simulated agents (threads, no
workers) run the real c10d rendezvous: ours (the job's own store process, every agent a
client with is_host=false, torch's handler wrapped in MembershipWatch) vs torch's stock
(agent 0 hosts the TCPStore, as bare torchrun). Same N, same host, interleaved rounds;
last_call_timeout 2 s both; keep_alive_interval 5 s and 3 attempts (torch's defaults, which
the kit keeps), lengthened to 15 s on both sides from 256 agents: the simulated clients share
this host's 2 cores (threads under one GIL per host process) and at 256 missed the 15 s expiry
long before real nodes would. Each cell: ours / torch's (medians). Store ops are counted at
each client (every get, compare_set, add, check, set); "steady" is two keep-alive intervals of
the formed group:
its keep-alive timers and the agent monitor loop's `num_nodes_waiting` every 0.1 s (a read
of the state at most once a second, torch's cache). Re-formed: from one agent's death (its
heartbeats stop) to every survivor through `next_rendezvous` again; torch's handler drops
the dead node only when its heartbeat is 15 s old, which dominates.

![growth with N]({plot})

This table: the run of 2026-11-27 07:43-08:16 UTC on a quiet host (load 2-3 up to N = 128;
the simulation's own 8-33 at 256 and 512), 3, 3 and 2 interleaved rounds at N = 64, 128, 256;
512 did not form within 300 s (the state then held 198 of 512 participants: agents dropped
for late heartbeats, rejoining, dropping others; 512 client threads on 2 cores).

Against the goal (ours <= 1.0x torch's): the two sides run the same protocol against the same
server (a TCPStore with libuv; ours in a process of its own, torch's in agent 0's), and they
differ by less than the runs of one side differ among themselves. Steady traffic per agent and
keep-alive interval: 6.10 / 6.12 at 64, 17.6 / 18.1 at 256; by operation at 64 both sides made
512 gets and 263-268 compare_sets in the 10 s window (every agent's monitor loop reading the
state once a second through torch's cache, every heartbeat's write). The 1.21x of the first
run at 64 came from a host at load 27 (the sweeps that did not keep their 0.1 s). Forming
and re-forming are contention among N compare-and-set writers: at 64 (63 agents under one
GIL) the same side formed in 8-17 s from one round to the next. A three-way run at 64
(2026-11-27 08:17-08:27 UTC, 3 interleaved rounds each) separates the two differences: ours'
store process with torch's bare handler formed in 8.1, 17.3, 9.7 s (median 9.7), torch's in
8.3, 12.8, 11.2 s (11.2), ours (store process and MembershipWatch) in 9.6, 16.6, 12.2 s
(12.2); re-formed in 28.3, 26.9, 27.0 / 26.3, 26.0, 28.9 / 25.7, 36.6, 26.5 s. MembershipWatch
adds no store operation (it reads the state the handler already synced), so its forming medians
differ from the store-only side's by the noise the rounds show. The medians in the table are
therefore not read as a ranking: within this host's noise ours is neither faster nor slower.

"""

COST_HEAD = """
The state's cost: torch's c10d handler keeps the whole rendezvous (participants, heartbeats)
in one store key, rewritten by compare-and-set, so each write and read moves all of it.
One client, its heartbeat write (pickle, compare_set, unpickle) and a read, by state size:

| nodes | state bytes | write (ms) | read (ms) | heartbeat writes needed /s | writes one after another /s |
|---|---|---|---|---|---|
"""

ESTIMATE = """
Where the single store saturates (estimate). Not on the store server's CPU: it compares and
copies bytes (steady CPU above) and one TCPStore thread moves far more than this. The limit
is the one key. Every heartbeat is a compare_set of the whole state; a write lands only if
no other landed between its read and its arrival, so the writes go one after another, each
taking a client's round trip plus its (un)pickling of a state that grows with N. The
heartbeats alone need N / 5 writes a second; one after another the key takes
1 / (write time at N). By the table the two meet near N = {sat} (on this host's CPU; the write
time grows about as N, so a client twice as fast moves it up only about 1.4x). Past that,
heartbeats miss their 15 s, live nodes are dropped, rejoin and drop others: the group never
forms. The reads add N a second of the whole state (at 4,096 nodes ~340 KB each: ~1.4 GB/s
out of the store, a 10-Gbit link). The same holds for ours and torch's: the store's process
differs, not the protocol. Remedies, cheapest first: heartbeats in keys of their own
(one small `set` per node, the state rewritten only on joins and leaves: O(1) bytes per
heartbeat, no contention); then sharded keys (a key per group of nodes) or a tree of barriers
(nodes meet in groups of ~64, one leader each meets the others); beyond a few thousand
nodes, etcd (torch's etcd-v2 rendezvous, or a lease per node with watches).
"""

LIMITS = """
Why not more on this host: the agents' client work (each write and read (un)pickles the
whole state) runs on 2 shared cores instead of N machines, in host processes whose threads
share one GIL each (64 agents per process, at most 8 processes), so the simulated clients
are far slower than real ones, and heartbeats miss their 15 s at a smaller N than a real
cluster would. A size that does not form within its deadline is reported above with the
state the store held then. File descriptors were not the limit (RLIMIT_NOFILE raised to the
hard limit, 20,000), nor memory (see the RSS columns). The first run of 2026-11-27, on a
host at load ~27 (other jobs and a test loop), did not hold 256 (its participants rose and
fell between about 110 and 170 for 300 s); the quiet run above held 256 and stopped at 512.
"""


def plot(rows: list[dict[str, Any]], out: Any) -> None:
    """Growth with N, log-log, ours solid and torch's dashed, one panel per figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = by_size(rows)
    fig, axes = plt.subplots(2, 4, figsize=(14, 6.5))
    for ax, (title, (end, _)) in zip(axes.flat, COLUMNS.items()):
        points = [(n, m[end]) for n, m in sorted(sizes.items()) if end in m]
        for key, style, label in (("ours", "-o", "ours"), ("baseline", "--s", "torch")):
            xs = [n for n, r in points if r[key]]
            ax.plot(xs, [r[key] for n, r in points if r[key]], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("agents (N)", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("rendezvous at scale, simulated agents on one 2-core host (bench/scale.py)")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)

"""The rendezvous at scale, by simulation: N agents, no workers, on this host, for N in
TORCHJOB_BENCH_SCALE (default 64,128,256,1024,4096). Ours: the job's own store process
(``python -m torchjob.trainer.store``), every agent its client (is_host=false), the kit's keyed
rendezvous (``rdzv.backend: torchjob``, trainer/rendezvous.py) wrapped in MembershipWatch.
Torch's stock: its c10d handler, agent 0 hosting the TCPStore (bare torchrun). Each agent runs
the real handler in a thread of a host process (bench/scale_agents.py), agent 0 alone in one.
Per trial: the group forms (all N through ``next_rendezvous``); a steady window (keep-alives,
and the monitor loop's ``num_nodes_waiting`` every 0.1 s); ours exchanges a failure verdict as
its agents do; one agent dies and the others re-form. Store operations are counted by each
client. Interleaved rounds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import resource
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, IO

from common import ENV, PY, ROOT, interleaved, median, row
from launch import free_port

from torchjob.jobs.command import STORE_MODULE
from torchjob.trainer.store import READY_LINE

HOST = ROOT / "bench" / "scale_agents.py"
AGENTS_PER_HOST = 64  # threads of one host share its GIL; at most 8 hosts (RSS ~250 MiB each)
MAX_HOSTS = 8
STATE_SIZES = (64, 256, 1024, 4096, 16384)  # nodes in the rendezvous state, for its cost alone


@dataclass(frozen=True)
class Settings:
    """What a trial uses; the defaults are the kit's (torch's keep-alive defaults)."""

    keep_alive_s: int = 5  # torch's keep_alive_interval, which the kit leaves as it is
    max_attempt: int = 3  # torch's keep_alive_max_attempt: a node is dead after 15 s
    last_call_s: int = 2
    steady_s: float = 10.0  # two keep-alive intervals
    phase_s: float = 300.0  # a phase's deadline


def host_sizes(nodes: int) -> list[int]:
    """Agents per host process: agent 0 alone, the others split evenly."""
    rest = nodes - 1
    hosts = min(MAX_HOSTS, max(1, math.ceil(rest / AGENTS_PER_HOST))) if rest else 0
    return [1] + [rest // hosts + (i < rest % hosts) for i in range(hosts)]


def die_with_parent() -> None:
    """In the child: SIGKILL when the bench dies, however it dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class Group:
    """One trial's processes (ours: the store first), their answers, and their end."""

    def __init__(self, side: str, nodes: int, tmp: Path, settings: Settings) -> None:
        self.side, self.nodes, self.tmp, self.settings = side, nodes, tmp, settings
        self.port, self.run_id = free_port(), uuid.uuid4().hex[:8]
        self.procs: list[subprocess.Popen[str]] = []
        self.store: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.up: list[dict[str, Any]] = []

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.write("quit\n")
                    proc.stdin.flush()
                except OSError:
                    pass
        for proc in [*self.procs, *([self.store] if self.store else [])]:
            try:
                proc.wait(timeout=10) if proc is not self.store else proc.terminate()
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _read(self, index: int, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put((index, line))
        self.lines.put((index, None))

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen[str]:
        err = open(self.tmp / f"{name}.err", "w")
        proc = subprocess.Popen(argv, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, preexec_fn=die_with_parent)
        err.close()
        index = len(self.procs) if name != "store" else -1
        threading.Thread(target=self._read, args=(index, proc.stdout), daemon=True).start()
        return proc

    def tail(self, index: int) -> str:
        name = "store" if index < 0 else f"host{index}"
        lines = (self.tmp / f"{name}.err").read_text(errors="replace").splitlines()
        return "\n".join(lines[-15:])

    def expect(self, event: str, hosts: list[int]) -> dict[int, dict[str, Any]]:
        """Each of ``hosts``' answer ``event``, within the phase's deadline."""
        deadline, got = time.monotonic() + self.settings.phase_s, {}
        while len(got) < len(hosts):
            try:
                index, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                missing = sorted(set(hosts) - set(got))
                raise TimeoutError(f"{self.side}, N={self.nodes}: no {event!r} from hosts "
                                   f"{missing} within {self.settings.phase_s:g} s; the "
                                   f"rendezvous state then: {self.peek()}") from None
            if line is None:
                raise RuntimeError(f"{self.side}, N={self.nodes}: host {index} exited during "
                                   f"{event!r}:\n{self.tail(index)}")
            if index < 0:
                continue
            answer = json.loads(line)
            if answer["event"] != event:
                raise RuntimeError(f"host {index} answered {answer} to {event!r}")
            got[index] = answer
        return got

    def start(self) -> None:
        """The store (ours), agent 0's host, then the other hosts, each connected."""
        if self.side in ("ours", "store"):
            self.store = self._spawn([PY, "-m", STORE_MODULE, "--port", str(self.port)], "store")
            self._wait_store()
        sizes, first = host_sizes(self.nodes), 0
        for i, count in enumerate(sizes):
            self.procs.append(self._spawn(
                [PY, str(HOST), "--side", self.side, "--endpoint", f"127.0.0.1:{self.port}",
                 "--run-id", self.run_id, "--nodes", str(self.nodes), "--first", str(first),
                 "--count", str(count), "--keep-alive", str(self.settings.keep_alive_s),
                 "--max-attempt", str(self.settings.max_attempt),
                 "--last-call", str(self.settings.last_call_s)], f"host{i}"))
            first += count
            if i == 0:  # torch's: agent 0 serves the store before the others connect
                self.up += self.expect("up", [0]).values()
                self.expect("ready", [0])
        rest = list(range(1, len(sizes)))
        self.up += [a for _, a in sorted(self.expect("up", rest).items())]
        self.expect("ready", rest)

    def _wait_store(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                index, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"the store exited:\n{self.tail(-1)}")
            if line.strip() == READY_LINE.format(port=self.port):
                return
        raise TimeoutError("the store did not serve within 120 s")

    def ask(self, command: str, hosts: list[int] | None = None) -> dict[int, dict[str, Any]]:
        hosts = list(range(len(self.procs))) if hosts is None else hosts
        for i in hosts:
            stdin = self.procs[i].stdin
            assert stdin is not None
            stdin.write(command + "\n")
            stdin.flush()
        return self.expect(command.split()[0], hosts)

    def peek(self) -> str:
        """The rendezvous' shared state as the store holds it, in a line."""
        if self.side == "ours":
            return keyed_state(self.port, self.run_id)
        try:
            state, raw = shared_state(self.port, self.run_id)
        except Exception as exc:
            return f"unread ({type(exc).__name__}: {exc})"
        return (f"round {state.round}, complete {state.complete}, {len(state.participants)} "
                f"participants, {len(state.wait_list)} waiting, {len(raw)} bytes")

    def serving(self) -> int:
        """The pid of the process that serves the store: ours' store, torch's agent 0."""
        return self.store.pid if self.store else self.procs[0].pid


def shared_state(port: int, run_id: str) -> tuple[Any, bytes]:
    """The c10d rendezvous state of ``run_id`` in the store on ``port``, and its raw value."""
    import base64
    import pickle
    from datetime import timedelta

    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    raw = store.get(f"torch.rendezvous.{run_id}")
    return pickle.loads(base64.b64decode(raw)), raw


def keyed_state(port: int, run_id: str) -> str:
    """The keyed rendezvous' rounds (trainer/rendezvous.py) in the store on ``port``: each
    round's joined count and size, in a line."""
    from datetime import timedelta

    from torch.distributed import PrefixStore, TCPStore
    try:
        keys = PrefixStore(f"torchjob.rdzv.{run_id}",
                           TCPStore("127.0.0.1", port, is_master=False,
                                    timeout=timedelta(seconds=10)))
        out = []
        for r in range(4):
            if not keys.check([f"r{r}/count"]):
                break
            size = keys.get(f"r{r}/size").decode() if keys.check([f"r{r}/size"]) else "open"
            out.append(f"round {r}: {keys.add(f'r{r}/count', 0)} joined, size {size}")
        return "; ".join(out) or "no round joined"
    except Exception as exc:
        return f"unread ({type(exc).__name__}: {exc})"


def state_cost(nodes: int, tries: int = 5) -> dict[str, float]:
    """One client's cost of the c10d handler's state at ``nodes`` nodes, through torch's own
    state holder and backend, on a store in this process: a write (its heartbeat: pickle,
    compare_set, unpickle) and a read (get, unpickle), best of ``tries``; the state's bytes."""
    from datetime import datetime, timedelta, timezone

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import \
        C10dRendezvousBackend

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    backend = C10dRendezvousBackend(store, "cost")
    settings = dr.RendezvousSettings("cost", 1, nodes, dr.RendezvousTimeout(),
                                     timedelta(seconds=5), 3)
    holder = dr._BackendRendezvousStateHolder(backend, settings, cache_duration=0)
    now, state = datetime.now(timezone.utc), holder.state
    for i in range(nodes):
        node = dr._NodeDesc(f"node-{i:05d}.cluster.example", 10000 + i, 0)
        state.participants[node], state.last_heartbeats[node] = i, now
    state.complete = True
    writes, reads = [], []
    for _ in range(tries):
        holder.state.last_heartbeats[node] = datetime.now(timezone.utc)
        holder.mark_dirty()
        began = time.perf_counter()
        holder.sync()
        writes.append(time.perf_counter() - began)
        began = time.perf_counter()
        holder.sync()
        reads.append(time.perf_counter() - began)
    raw = store.get("torch.rendezvous.cost")
    return {"write_s": min(writes), "read_s": min(reads), "bytes": len(raw)}


def summed(answers: dict[int, dict[str, Any]], key: str) -> float:
    return sum(a[key] for a in answers.values())


def by_op(answers: dict[int, dict[str, Any]]) -> dict[str, int]:
    """The hosts' store operations, by operation (get, compare_set, ...)."""
    out: dict[str, int] = {}
    for answer in answers.values():
        for op, count in answer.get("by_op", {}).items():
            out[op] = out.get(op, 0) + count
    return out


def checked(answers: dict[int, dict[str, Any]], what: str, world: int) -> list[float]:
    """Every agent's return time; an error that says what failed."""
    errors = [e for a in answers.values() for e in a.get("errors", [])]
    worlds = sorted({w for a in answers.values() for w in a.get("world", [])})
    if errors or worlds != [world]:
        raise RuntimeError(f"{what}: world sizes {worlds} (expected {world}); errors: "
                           + "; ".join(errors[:5]))
    return [t for a in answers.values() for t in a["done"]]


def trial(side: str, nodes: int, settings: Settings) -> dict[str, float]:
    """One group of ``nodes`` agents on ``side``: its figures (see the module's docstring)."""
    from scale_agents import cpu_s, rss

    with tempfile.TemporaryDirectory() as tmp, Group(side, nodes, Path(tmp), settings) as g:
        g.start()
        pid, out = g.serving(), {}
        cpu0, t0 = cpu_s(pid), time.time()
        formed = g.ask("form")
        out["form_s"] = max(checked(formed, "forming", nodes)) - t0
        out["form_ops"] = summed(formed, "ops")
        out["form_by_op"] = by_op(formed)  # type: ignore[assignment]
        out["form_serving_cpu_s"] = cpu_s(pid) - cpu0
        cpu0 = cpu_s(pid)
        steady = g.ask(f"steady {settings.steady_s}")
        window = max(a["window_s"] for a in steady.values())
        out["steady_ops"], out["steady_bytes"] = summed(steady, "ops"), summed(steady, "bytes")
        out["steady_window_s"] = window
        out["steady_late_sweeps"] = summed(steady, "late_sweeps")
        out["steady_sweeps"] = min(a["sweeps"] for a in steady.values())
        out["steady_by_op"] = by_op(steady)  # type: ignore[assignment]
        out["serving_cpu_frac"] = (cpu_s(pid) - cpu0) / window
        out["serving_rss"] = rss(pid)
        clients = [steady[i]["rss"] - g.up[i]["rss"] for i in range(1, len(g.procs))]
        out["client_bytes_per_agent"] = sum(clients) / max(1, nodes - 1)
        if side == "ours":
            said = g.ask("verdict")
            out["verdict_ops"], out["verdict_max_ops"] = summed(said, "ops"), \
                max(a["max_ops"] for a in said.values())
        victim, owner = nodes - 1, len(g.procs) - 1  # the last agent, never agent 0
        t0 = time.time()
        g.ask(f"kill {victim}", [owner])
        reformed = g.ask("reform")
        out["reform_s"] = max(checked(reformed, "re-forming", nodes - 1)) - t0
        out["reform_ops"] = summed(reformed, "ops")
        return out


def raise_nofile() -> int:
    """RLIMIT_NOFILE raised to its hard limit (children inherit it); the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def figures(nodes: int, mine: list[dict[str, float]], base: list[dict[str, float]],
            settings: Settings) -> list[dict[str, Any]]:
    """The rows of one N: medians over the rounds, every sample in the detail; no baseline
    where torch's stock did not form (``base`` empty)."""
    def med(samples: list[dict[str, float]], key: str, per: float = 1.0) -> float:
        return median([s[key] / per for s in samples])

    def both(key: str, per: float = 1.0) -> tuple[float, float | None]:
        return med(mine, key, per), (med(base, key, per) if base else None)

    intervals = [s["steady_window_s"] / settings.keep_alive_s for s in mine + base]
    per_interval = nodes * median(intervals)
    rate = [s["form_ops"] / s["form_s"] for s in mine], [s["form_ops"] / s["form_s"] for s in base]
    torch_rate = median(rate[1]) if base else None
    name = f"{nodes} agents:"
    raw = {"ours_samples": mine, "torch_samples": base, "keep_alive_s": settings.keep_alive_s}
    rows = [
        row("scale", f"{name} group formed (median)", *both("form_s"), "<= 1.0", "s", **raw),
        row("scale", f"{name} store ops/s while forming", median(rate[0]), torch_rate,
            "report", "ops/s"),
        row("scale", f"{name} store ops per agent to form", *both("form_ops", nodes), "<= 1.0",
            "ops"),
        row("scale", f"{name} steady store ops per agent per keep-alive interval",
            *both("steady_ops", per_interval), "<= 1.0", "ops",
            bytes_per_op=[s["steady_bytes"] / max(1, s["steady_ops"]) for s in mine + base]),
        row("scale", f"{name} store server CPU, steady", *both("serving_cpu_frac"), "report",
            "cores"),
        row("scale", f"{name} RSS of the process serving the store", *both("serving_rss", 2**20),
            "report", "MiB"),
        row("scale", f"{name} client memory per agent", *both("client_bytes_per_agent", 1024),
            "<= 1.0", "KiB"),
        row("scale", f"{name} re-formed after one agent died (median)", *both("reform_s"),
            "<= 1.0", "s"),
        row("scale", f"{name} failure verdict exchange: store ops per agent",
            med(mine, "verdict_ops", nodes), None, "O(1)", "ops",
            max_per_agent=[s["verdict_max_ops"] for s in mine]),
    ]
    return rows


def sizes_and_rounds(quick: bool) -> list[tuple[int, int]]:
    sizes = [int(n) for n in os.environ.get("TORCHJOB_BENCH_SCALE", "64,128,256,1024,4096")
             .split(",")]
    return [(n, 1 if quick else (3 if n <= 128 else 2 if n <= 256 else 1)) for n in sizes]


def cost_rows(keep_alive_s: int) -> list[dict[str, Any]]:
    """The state's cost per write at each size of STATE_SIZES (the same code on both sides)."""
    rows = []
    for nodes in STATE_SIZES:
        cost = state_cost(nodes)
        rows.append(row("scale", f"state of {nodes} nodes: one heartbeat write (one client)",
                        cost["write_s"] * 1e3, None, "report", "ms", read_ms=cost["read_s"] * 1e3,
                        state_bytes=cost["bytes"],
                        heartbeat_writes_needed_per_s=nodes / keep_alive_s,
                        serial_writes_possible_per_s=1 / cost["write_s"]))
    return rows


def attempt(side: str, nodes: int, settings: Settings) -> dict[str, Any]:
    """One trial; a side that does not form (or fails otherwise) says why instead."""
    try:
        return trial(side, nodes, settings)
    except Exception as exc:
        print(f"  N={nodes} {side} failed: {type(exc).__name__}: {exc}", flush=True)
        return {"failed": f"{type(exc).__name__}: {str(exc)[:2000]}"}


def run(quick: bool = False, settings: Settings = Settings()) -> list[dict[str, Any]]:
    """Every N in turn, both sides interleaved, until ours does not form; past the N where
    torch's stock did not form, ours alone (said in a row of its own)."""
    print(f"  RLIMIT_NOFILE raised to {raise_nofile()}", flush=True)
    rows = cost_rows(settings.keep_alive_s)  # the hang watchdog's traffic: hang_exchange.py
    torch_failed: str | None = None  # why torch's stock did not form, from that N on
    upto = os.environ.get("TORCHJOB_BENCH_SCALE_TORCH_UPTO")  # a run of the larger N alone
    if upto:
        torch_failed = f"N above {upto}: it did not form at {upto} in an earlier run"
    for nodes, rounds in sizes_and_rounds(quick):
        def say(m: dict[str, Any], b: dict[str, Any]) -> str:
            def one(r: dict[str, Any]) -> str:
                return "failed" if "failed" in r else \
                    f"formed {r['form_s']:.2f} s re-formed {r['reform_s']:.2f} s"
            return f"N={nodes} ours {one(m)}; torch {one(b)}"
        at = at_size(nodes, settings)
        skipped = {"failed": f"not tried ({torch_failed})"}
        mine, base = interleaved(rounds, lambda: attempt("ours", nodes, at),
                                 (lambda: attempt("torch", nodes, at)) if torch_failed is None
                                 else (lambda: skipped), say)
        ours_ok = [m for m in mine if "failed" not in m]
        torch_ok = [b for b in base if "failed" not in b]
        if not ours_ok:  # the largest N this host holds: say why, keep the others
            rows.append(row("scale", f"{nodes} agents: not measured", 0, None, "report", "-",
                            why=mine[0]["failed"]))
            break
        if not torch_ok:
            torch_failed = torch_failed or f"N={nodes}: {base[0]['failed']}"
            rows.append(row("scale", f"{nodes} agents: torch's stock not measured", 0, None,
                            "report", "-", why=base[0]["failed"]))
        rows += figures(nodes, ours_ok, torch_ok, at)
    return rows


# Past this many simulated agents the keep-alive is lengthened on both sides: all agents'
# clients share this machine's 2 cores (threads under one GIL per host process), and at 256 they
# missed torch's 15 s expiry long before real nodes would (live agents dropped and rejoining).
SLOW_KEEP_ALIVE_FROM = 256
SLOW_KEEP_ALIVE_S = 15


def at_size(nodes: int, settings: Settings) -> Settings:
    """The settings a trial of ``nodes`` agents uses (the same for both sides)."""
    if nodes < SLOW_KEEP_ALIVE_FROM or settings.keep_alive_s >= SLOW_KEEP_ALIVE_S:
        return settings
    return dataclasses.replace(settings, keep_alive_s=SLOW_KEEP_ALIVE_S,
                               steady_s=2.0 * SLOW_KEEP_ALIVE_S)

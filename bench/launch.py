"""Launch with N agents on this host: ``torchjob run`` of the default job with ``nnodes`` = N
(the local backend starts N agents, ``python -m torchjob.trainer.agent``, one worker each, c10d
rendezvous on 127.0.0.1; the first agent hosts the store, as torchrun does for a fixed-size
job) vs N bare ``torchrun`` agents started the same way (the same nnodes, c10d endpoint,
rdzv-conf, monitor interval and max restarts; the same trainer and arguments).

Two figures per N, each a ratio of medians over rounds that alternate which side goes first:
- start to first step: from the command's start (for bare torchrun, the first of its N agents)
  to the first finished training step in metrics.jsonl (rank 0 writes it after DDP's first
  all-reduce, so every worker has taken its first step's forward and backward);
- the rendezvous: from the last agent's "Rendezvous'ing worker group" (it joined) to the last
  agent's "Rendezvous complete" (the group formed), from the agents' own logs (LOGLEVEL=INFO,
  torchrun's agent log, on both sides).
TORCHJOB_BENCH_AGENTS=1,2 chooses the sizes (default 1,2,4,8,16). On two cores, N agents
each import torch (and each worker imports it again): both sides grow with N, the ratio is
what counts.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from common import ENV, TORCHRUN, flags, median, metrics, row, torchjob

ARGS = dict(max_steps=1, log_every=1, progress="lines", eval_every=0)
RDZV_CONF = "join_timeout=600,last_call_timeout=5"  # what torchjob.jobs.command renders
LOG_ENV = {**ENV, "LOGLEVEL": "INFO"}
STAMP = r"[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) "
JOINED = re.compile(STAMP + r".*Rendezvous'ing worker group")
FORMED = re.compile(STAMP + r".*Rendezvous complete for workers")
TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def day_seconds(t: float) -> float:
    lt = time.localtime(t)
    return lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + t % 1


def stamps(text: str, pattern: re.Pattern[str]) -> list[float]:
    return [int(h) * 3600 + int(m) * 60 + float(s) for h, m, s in pattern.findall(text)]


def measure(start: float, run_dir: Path, logs: str, agents: int) -> tuple[float, float]:
    """(start to first step, last agent joined to group formed), in seconds."""
    first = next(r for r in metrics(run_dir) if r["kind"] == "train")
    joined, formed = stamps(logs, JOINED), stamps(logs, FORMED)
    if len(joined) < agents or len(formed) < agents:
        raise RuntimeError(f"expected {agents} agents' rendezvous lines, saw {len(joined)} "
                           f"joined and {len(formed)} formed:\n{logs[-3000:]}")
    return first["time"] - start, (max(formed) - max(joined)) % 86400


def ours(agents: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "out.log"
        with open(log, "w") as out:
            start = time.time()
            subprocess.run(torchjob(Path(tmp) / "run", "default.yaml", f"nnodes={agents}",
                                    "nproc_per_node=1", **ARGS),
                           env=LOG_ENV, stdout=out, stderr=subprocess.STDOUT, check=True,
                           timeout=TIMEOUT_S)
        return measure(start, Path(tmp) / "run", log.read_text(errors="replace"), agents)


def bare(agents: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port, rid = free_port(), uuid.uuid4().hex[:8]
        argv = [TORCHRUN, "--nnodes", str(agents), "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", rid, "--rdzv-conf", RDZV_CONF, "--max-restarts", "3",
                "--monitor-interval", "0.1", "-m", "torchjob.trainer", "--run-dir", f"{tmp}/run",
                *flags(ARGS)]
        logs = [Path(tmp) / f"agent{i}.log" for i in range(agents)]
        start = time.time()
        procs = []
        for log in logs:
            with open(log, "w") as out:
                procs.append(subprocess.Popen(argv, env=LOG_ENV, stdout=out,
                                              stderr=subprocess.STDOUT))
        try:
            for proc in procs:
                if proc.wait(timeout=TIMEOUT_S) != 0:
                    raise RuntimeError(f"a torchrun agent exited {proc.returncode}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        text = "\n".join(log.read_text(errors="replace") for log in logs)
        return measure(start, Path(tmp) / "run", text, agents)


def run(quick: bool = False) -> list[dict]:
    sizes = [int(n) for n in os.environ.get("TORCHJOB_BENCH_AGENTS", "1,2,4,8,16").split(",")]
    rounds = 1 if quick else 3
    rows = []
    for n in sizes:
        mine: list[tuple[float, float]] = []
        base: list[tuple[float, float]] = []
        for r in range(rounds):
            for side in (("ours", "bare") if r % 2 == 0 else ("bare", "ours")):
                (mine if side == "ours" else base).append(ours(n) if side == "ours"
                                                          else bare(n))
            print(f"  N={n} round {r + 1}: torchjob {mine[-1][0]:.2f} s (rdzv "
                  f"{mine[-1][1]:.2f}), torchrun {base[-1][0]:.2f} s (rdzv {base[-1][1]:.2f})",
                  flush=True)
        rows.append(row("launch", f"{n} agent(s): start to first step (median)",
                        median([m[0] for m in mine]), median([b[0] for b in base]), "<= 1.05",
                        "s", torchjob_s=[round(m[0], 2) for m in mine],
                        torchrun_s=[round(b[0], 2) for b in base]))
        rows.append(row("launch", f"{n} agent(s): last join to group formed (median)",
                        median([m[1] for m in mine]), median([b[1] for b in base]),
                        "report", "s", torchjob_s=[round(m[1], 3) for m in mine],
                        torchrun_s=[round(b[1], 3) for b in base]))
    return rows

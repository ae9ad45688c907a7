"""One hang trial of a user's unmodified script (scripts/hang_shapes.py) on any backend: the
culprit rank is drawn at random, enters the hang shape on the first attempt where its shape
says (mid-run at step 5, before the first collective of all, before init_process_group) while
the others wait for it there, and must be the rank named, with its node and top frame, by the
agent's line, the ledger, summary.json and the stack files; the job restarts and finishes.
Used by the local, docker and Slurm tests."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

from tests.procs import env_for_tests, torchjob

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hang_shapes.py"
# shape: how the culprit's process is, its frame, where it hangs (hang_shapes.py's AT)
SHAPES = {"stop": ("its process is stopped (state T)", "stop_here", "5"),
          "loop": ("running", "spin_here", "5"), "sleep": ("sleeping", "sleep_here", "1"),
          "io": ("sleeping", "read_here", "init")}
HANG_TIMEOUT_S = 10  # twice the heartbeat loss: a start-up that holds the GIL a while is no hang


def job_yaml(name: str, shape: str, culprit: int, nodes: int, nproc: int,
             pg_timeout: int = 0) -> str:
    # with the script's own process group timeout, the watchdog's is far above it: the
    # collective that times out tells who hangs
    hang_timeout = 20 * pg_timeout or HANG_TIMEOUT_S
    timeout = f", '{pg_timeout}'" if pg_timeout else ""
    return (f"name: {name}\nnnodes: {nodes}\nnproc_per_node: {nproc}\nmax_restarts: 1\n"
            f"hang_timeout: {hang_timeout}\ncheckpoint_budget: {HANG_TIMEOUT_S - 1}\n"
            f"trainer:\n  script: hang_shapes.py\n  args: ['{shape}', '{culprit}', "
            f"'{SHAPES[shape][2]}'{timeout}]\n")


def readable(out: str, limit: int = 6000) -> str:
    """The tail of ``out`` without C++ stack frames: a client that lost its store prints dozens
    of lines of them, which filled the whole tail of a failed trial's message."""
    cpp = re.compile(r"frame #\d+: |<omitting python frames>|^(\[[^]]*\] )?Exception raised from ")
    return "\n".join(line for line in out.splitlines() if not cpp.search(line))[-limit:]


def trial(cwd: Path, to: str, shape: str, *, nodes: int = 2, nproc: int = 2,
          name: str = "", pg_timeout: int = 0, on_node: int | None = None) -> str:
    """One trial in ``cwd``: ``torchjob run --to TO job.yaml``; its output, after every
    check. ``pg_timeout``: the script's process group timeout (s), so that a collective
    times out waiting for the culprit long before the watchdog's timeout; ``on_node``: the
    culprit is drawn from that node's ranks (default: from all)."""
    culprit = random.randrange(nodes * nproc) if on_node is None else \
        on_node * nproc + random.randrange(nproc)
    node = culprit // nproc
    name = name or f"hang-{shape}"
    cwd.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, cwd / "hang_shapes.py")
    job = cwd / "job.yaml"
    job.write_text(job_yaml(name, shape, culprit, nodes, nproc, pg_timeout))
    done = torchjob("run", "--to", to, str(job), cwd=cwd, env=env_for_tests(), timeout=400)
    code, out = done.returncode, done.stdout + done.stderr
    said = f"(culprit rank {culprit} on node {node}, shape {shape})\n{readable(out)}"
    run_dir = cwd / "runs" / name
    ledger_file = run_dir / "ledger.jsonl"
    assert code == 0, said + "\nledger:\n" + (
        ledger_file.read_text()[-3000:] if ledger_file.is_file() else "(none)")
    how, function, _ = SHAPES[shape]
    lines = [line for line in out.splitlines() if "torchjob: hang on node" in line]
    assert len(lines) == 1, said
    assert f"torchjob: hang on node {node}: rank {culprit} on node {node} ({how}" in lines[0], said
    assert f"hang_shapes.py:" in lines[0] and f"in {function}" in lines[0], said
    assert "last seen" not in lines[0], said  # a stopped rank: read from outside, where it is
    others = [r for r in range(nodes * nproc) if r != culprit]
    waiting = re.search(r"waiting for it: rank\(s\) ([\d, ]+)", lines[0])
    assert waiting, said
    told = [int(r) for r in waiting[1].split(", ")]
    # a timed-out collective names the culprit on its node, from the ranks that timed out there
    assert told == others or pg_timeout and told and set(told) <= set(others), said
    records = [json.loads(line) for line in ledger_file.read_text().splitlines()]
    hangs = [r for r in records if r["event"] == "hang"]
    assert len(hangs) == 1 and [(c["rank"], c["node"]) for c in hangs[0]["culprits"]] == [
        (culprit, node)], said
    assert "hang_shapes.py:" in hangs[0]["culprits"][0]["frame"], said
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1, said
    assert [(c["rank"], c["node"]) for c in summary["hangs"][0]["culprits"]] == [
        (culprit, node)], said
    stacks = run_dir / "hangs" / "attempt0" / f"node{node}-rank{culprit}.txt"
    assert stacks.is_file(), said
    return out

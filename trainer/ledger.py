"""The run's ledger: every restart and every change of membership, one JSON line each, in
``RUN_DIR/ledger.jsonl``; only ever appended to, so it outlives agents, requeues and runs.

The agent (trainer.torchrun_agent) writes it; the summary and the launchers read it. Its storm
guard: after ``max_stalled`` restarts in a row that came back to the same checkpoint, the next
failure stops the job (exit 1). The lines' fields: docs/internals.md.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torchjob.trainer.contract import MANIFEST, signal_of
from torchjob.trainer.dirs import write_whole

LEDGER = "ledger.jsonl"
MAX_LINE = 4096  # one write of at most this: lines of concurrent writers do not interleave


def path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / LEDGER


def node_name() -> str:
    """This agent's name in the ledger: its host and pid (two agents of one host, as the local
    backend runs them, stay apart; a restarted container or a requeued task is a new node)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def checkpoint_mark(checkpoint_dir: str | os.PathLike[str] | None) -> str | None:
    """The newest checkpoint in ``checkpoint_dir``: the name of the newest finished
    ``step_*`` (its manifest written, torchjob.trainer.checkpoint), or for a script that keeps its
    checkpoints its own way, the newest modification time of what is in the directory (and
    one level below); None when there is nothing."""
    if not checkpoint_dir:
        return None
    root = Path(checkpoint_dir)
    try:
        steps = sorted((p for p in root.glob("step_*") if (p / MANIFEST).is_file()), reverse=True)
        if steps:
            return steps[0].name
        newest = 0.0
        for entry in root.iterdir():
            if entry.name.startswith("."):
                continue
            newest = max(newest, entry.stat().st_mtime)
            if entry.is_dir():
                newest = max([newest, *(p.stat().st_mtime for p in entry.iterdir())])
    except OSError:
        return None
    return f"modified {time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(newest))}Z" \
        if newest else None


def exit_fields(exitcode: int) -> dict[str, Any]:
    """``{"exit": 1}`` or, for a death by signal, ``{"signal": "SIGKILL"}``."""
    name = signal_of(exitcode)
    return {"exit": exitcode} if name is None else {"signal": name}


def append(run_dir: str | os.PathLike[str], event: str, **fields: Any) -> None:
    """Add one line (best effort: a ledger that cannot be written never stops the job)."""
    record = {"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              **fields}
    line = json.dumps(record, default=str)
    if len(line) >= MAX_LINE:
        record["cause"] = str(record.get("cause", ""))[:MAX_LINE // 2] + "..."
        line = json.dumps(record, default=str)[:MAX_LINE - 1]
    try:
        target = path(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def read(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line of the ledger that parses, oldest first ([] when there is none)."""
    return read_lines(path(run_dir))


def read_lines(file: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's records; a line cut short by a kill is left out ([]: no file)."""
    try:
        text = file.read_text(errors="replace")
    except OSError:
        return []
    return parse_lines(text.splitlines())


def parse_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The lines that are JSON objects, as dicts; the others (cut short) left out."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def stalled(records: Iterable[dict[str, Any]], run_id: str,
            mark: str | None) -> list[dict[str, Any]]:
    """Run ``run_id``'s restarts in a row, newest last, that came back to checkpoint ``mark``:
    its restarts since its checkpoint last changed (a storm, when there are many), one per
    rendezvous round (several nodes may each note the same restart). Another run of the same
    directory (a new submission) starts afresh; a restart for a change of membership (a node
    joining) is no failure and not counted."""
    run: list[dict[str, Any]] = []
    rounds: set[Any] = set()
    for record in records:
        if (record.get("event") != "restart" or record.get("run") != run_id
                or record.get("membership")):
            continue
        if record.get("checkpoint") != mark:
            run, rounds = [], set()
            continue
        key = record.get("round")
        if key is None or key not in rounds:
            run.append(record)
            rounds.add(key)
    return run


def restarts(records: Iterable[dict[str, Any]], run_id: str) -> int:
    """How many times run ``run_id`` restarted its workers (the finished line, summary.json,
    status): its restart lines, one per rendezvous round (each node may note the same one)."""
    rounds: set[Any] = set()
    count = 0
    for record in records:
        if record.get("event") == "restart" and record.get("run") == run_id:
            key = record.get("round")
            count += key is None or key not in rounds
            rounds.add(key)
    return count


def hangs(records: Iterable[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """Run ``run_id``'s hangs: the attempt, the culprits (rank, node, how, frame), the
    waiting ranks and why (written by the agent, trainer.torchrun_agent)."""
    return [{k: r.get(k) for k in ("time", "attempt", "culprits", "waiting", "why")}
            for r in records if r.get("event") == "hang" and r.get("run") == run_id]


def storm_line(restarts: list[dict[str, Any]], mark: str | None) -> str:
    """Why the job stops: the storm and its last causes."""
    where = f"checkpoint {mark}" if mark else "no checkpoint"
    causes = "; ".join(f"{r.get('time', '?')} {r.get('cause', '?')}" for r in restarts[-3:])
    return (f"restart storm: {len(restarts)} restarts in a row came back to {where} without "
            f"getting further (max_stalled_restarts); stopping instead of restarting again. "
            f"Last causes: {causes}. The restarts are listed in {LEDGER}")


def membership(records: Iterable[dict[str, Any]], run_id: str | None = None) -> list[str]:
    """The membership changes between consecutive rounds of run ``run_id`` (None: the last run
    in the ledger), one line each: which nodes left or joined, when the change was noticed (the
    restart it caused, and the step the workers had reached), and the size and checkpoint the
    next round started with."""
    records = list(records)
    if run_id is None:
        runs = [r.get("run") for r in records if r.get("event") == "round"]
        run_id = runs[-1] if runs else None
    changes: list[str] = []
    before: list[str] | None = None
    noticed: str | None = None
    for record in records:
        if record.get("run") != run_id:
            continue
        if record.get("event") == "restart":
            if noticed is None:
                step = record.get("step")
                noticed = str(record.get("time", "?")) + (f", at step {step}"
                                                          if step is not None else "")
            continue
        if record.get("event") != "round":
            continue
        nodes = [str(n) for n in record.get("nodes", [])]
        if before is not None:
            left = [n for n in before if n not in nodes]
            joined = [n for n in nodes if n not in before]
            what = "; ".join([*([f"{', '.join(left)} left"] if left else []),
                              *([f"{', '.join(joined)} joined"] if joined else [])])
            if what:
                changes.append(
                    f"{what} (noticed {noticed or record.get('time', '?')}): from "
                    f"{record.get('time', '?')} {len(nodes)} node(s), world size "
                    f"{record.get('world_size', '?')}, from "
                    f"{record.get('checkpoint') or 'the start'}")
        before, noticed = nodes, None
    return changes


def summarize(run_dir: str, run_id: str, started: float, **how: Any) -> None:
    """``RUN_DIR/summary.json`` unless the workers wrote one since ``started``: how the run
    ended (``how``), its restarts, changes of membership and hangs."""
    summary = Path(run_dir, "summary.json")
    try:
        if summary.stat().st_mtime >= started:
            return
    except OSError:
        pass
    records = read(run_dir)
    data = {**how, "restarts": restarts(records, run_id),
            "membership": membership(records, run_id), "hangs": hangs(records, run_id)}
    try:
        write_whole(summary, json.dumps(data, indent=1) + "\n",
                    summary.with_name(".summary.json.part"))
    except OSError as exc:
        print(f"torchjob: cannot write {summary}: {exc}", file=sys.stderr)


def finished(line: str, run_dir: str | None, run_id: str) -> str:
    """The finished job's ``line``, with this run's restarts and changes of membership."""
    if run_dir is None:
        return line
    records = read(run_dir)
    count, changes = restarts(records, run_id), membership(records, run_id)
    line += f"; {count} restart(s)"
    if changes:
        line += "; membership changes: " + "; ".join(changes)
    if count or changes:
        line += f" (all in {path(run_dir)})"
    return line

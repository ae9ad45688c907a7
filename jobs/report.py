"""The run report (``torchjob report RUN_DIR``): one self-contained HTML page, inline SVG and
CSS, no script and no fetch, from what a run directory holds: the loss and evaluation curves
(metrics.jsonl), each rank's step time over time (step_times/), the ledger's rounds, restarts
and hangs with links to the stacks (hangs/), and the run's spec and environment (the launcher's
record, the newest checkpoint's config, summary.json). Pure but for ``load``."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from torchjob.jobs import charts
from torchjob.jobs.charts import Axis, Grid, Marker, Series
from torchjob.jobs.report_setup import setup_section
from torchjob.jobs.values import UserError
from torchjob.trainer import ledger, stragglers
from torchjob.trainer.contract import MANIFEST
from torchjob.trainer.report import NOT_A_SCORE, STEP_TIMES, is_number, read_metrics

REPORT = "report.html"
COLUMNS = 48  # the heat map's time buckets, at most
RESTART, HANG = "#e67e00", "#c0392b"
STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:960px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
svg{background:#fff;display:block;margin:6px 0}.title{font-weight:600;text-anchor:middle}
.tick,.note{font-size:11px}.tick{fill:#444}.label{font-size:12px;
text-anchor:middle}.axis{stroke:#333}.grid{stroke:#eee}table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:8px;white-space:pre-wrap;word-break:break-all}
.charts{display:flex;flex-wrap:wrap;gap:8px}li{margin:4px 0}.hang{color:#c0392b}
.restart{color:#a35a00}.empty{color:#777;font-style:italic}"""


@dataclass
class RunFiles:
    """What a run directory holds, read once; absent files are empty values."""

    run_dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # the ledger's lines
    summary: dict[str, Any] = field(default_factory=dict)
    step_times: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)  # the launcher's run.json
    manifest: dict[str, Any] = field(default_factory=dict)  # the newest checkpoint's
    stacks: list[str] = field(default_factory=list)  # hangs/attempt<A>/*.txt, relative


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def finite(value: Any) -> float | None:
    """``value`` when it is a finite number; None for anything else (a word, null, NaN)."""
    return float(value) if is_number(value) and math.isfinite(value) else None


def newest(paths: list[Path], key: str) -> dict[str, Any]:
    """Of the JSON files ``paths``, the one whose ``key`` is largest ({} when none); a ``key``
    that is not a number counts as 0."""
    found = [read_json(p) for p in paths]
    return max(found, key=lambda d: finite(d.get(key)) or 0.0, default={})


def load(run_dir: Path) -> RunFiles:
    """Read a run directory; a missing one, or one holding nothing of a run, is the user's
    mistake (UserError, with the fix)."""
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory; give the run_dir of a job that "
                        "ran (e.g. runs/NAME), or its handle (local:RUN_ID)")
    times = {int(p.stem[4:]): ledger.read_lines(p)
             for p in (run_dir / STEP_TIMES).glob("rank*.jsonl")
             if p.stem[4:].isascii() and p.stem[4:].isdigit()}
    checkpoints = sorted(run_dir.glob(f"**/step_*/{MANIFEST}"))
    run_dir = run_dir.resolve()
    files = RunFiles(run_dir, read_metrics(run_dir / "metrics.jsonl"), ledger.read(run_dir),
                     read_json(run_dir / "summary.json"), dict(sorted(times.items())),
                     newest(list(run_dir.glob(".torchjob/*/run.json")), "created"),
                     read_json(checkpoints[-1]) if checkpoints else {},
                     sorted(str(p.relative_to(run_dir))
                            for p in run_dir.glob("hangs/attempt*/*.txt")))
    if not (files.metrics or files.events or files.summary or files.record):
        raise UserError(f"{run_dir}: holds nothing of a run (no metrics.jsonl, ledger.jsonl, "
                        "summary.json or .torchjob record); give the run_dir of a job that ran")
    return files


def epoch_of(stamp: Any) -> float | None:
    """Seconds since the epoch of a ledger time (``2024-01-02T03:04:05Z``); None if not one."""
    try:
        return datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


# -- the curves --------------------------------------------------------------------------------

def step_markers(files: RunFiles) -> list[Marker]:
    """Each restart at the step its workers had reached."""
    return [Marker(float(r["step"]), "restart" + (" (hang)" if "hung" in str(r.get("cause"))
                                                  else ""), "restart", RESTART)
            for r in files.events
            if r.get("event") == "restart" and isinstance(r.get("step"), int)]


def curves(files: RunFiles) -> str:
    """Train and eval loss by step; the evaluation's other score (accuracy, perplexity)."""
    train = [r for r in files.metrics if r.get("kind") == "train" and "loss" in r]
    evals = [r for r in files.metrics if r.get("kind") == "eval"]
    if not train and not evals:
        return '<p class="empty" data-empty="curves">No metrics.jsonl: no curves.</p>'
    loss = [Series("train-loss", "train loss", [(r["step"], r["loss"]) for r in train]),
            Series("eval-loss", "eval loss", [(r["step"], r["loss"]) for r in evals
                                              if "loss" in r], dots=True)]
    steps = [float(r["step"]) for r in files.metrics]
    x = charts.axis("step", steps, pad=0.0, integer=True)
    out = [charts.line_chart("loss", "loss", loss, x,
                             charts.axis("loss", [p[1] for s in loss for p in s.points]),
                             step_markers(files))]
    score = next((k for r in evals for k in r if k not in NOT_A_SCORE), None)
    if score is not None:
        points = [(float(r["step"]), float(r[score])) for r in evals if score in r]
        bounds = (0.0, 1.0) if score == "accuracy" else None
        y = charts.axis(score, [p[1] for p in points], bounds=bounds)
        out.append(charts.line_chart(score, f"eval {score}",
                                     [Series(f"eval-{score}", f"eval {score}", points, dots=True)],
                                     x, y, step_markers(files)))
    return '<div class="charts">' + "".join(out) + "</div>"


# -- step time per rank over time --------------------------------------------------------------

def work(row: dict[str, Any]) -> tuple[float, float] | None:
    """A step-time line's time and median step work (ms); None without steps, or damaged."""
    at, p50 = finite(row.get("time")), finite(row.get("p50_ms"))
    return (at, p50) if row.get("steps") and at is not None and p50 is not None else None


def worked(files: RunFiles) -> dict[int, list[tuple[float, float]]]:
    """Each rank that has a file (only those: ranks may be sparse), its lines' ``work``."""
    return {rank: [w for w in map(work, rows) if w is not None]
            for rank, rows in files.step_times.items()}


def buckets(files: RunFiles, events: list[float]) -> tuple[Grid, float] | None:
    """Each rank's median step work (ms) per time bucket, and the time of the first bucket;
    the buckets span the step times and ``events`` (a hang, a restart) too."""
    done = worked(files)
    stamps = [at for rows in done.values() for at, _ in rows]
    if not stamps:
        return None
    start, end = min(stamps + events), max(stamps + events)
    span = max(end - start, 1e-3)
    columns = max(1, min(COLUMNS, max(len(rows) for rows in files.step_times.values())))
    width = span / columns
    cells: list[list[float | None]] = []
    for rows in done.values():
        seen: list[list[float]] = [[] for _ in range(columns)]
        for at, p50 in rows:
            seen[min(int((at - start) / width), columns - 1)].append(p50)
        cells.append([statistics.median(v) if v else None for v in seen])
    x = charts.axis(f"seconds after {stamp(start)} (each column {width:.2g} s)", [0.0, span],
                    pad=0.0)
    return Grid(cells, [f"rank {r}" for r in done], Axis(x.label, 0.0, span, x.ticks),
                ids=list(done)), start


def slow_ranks(files: RunFiles) -> list[int]:
    """Ranks whose median step work is above the median rank's by trainer.stragglers' margin."""
    done = worked(files)
    per_rank = [{"steps": len(rows), "p50_ms": statistics.median(p for _, p in rows)
                 if rows else 0.0} for rows in done.values()]
    ranks = list(done)
    return [ranks[i] for i in stragglers.report(per_rank)["stragglers"]] if per_rank else []


def heat(files: RunFiles) -> str:
    """The heat map of step time per rank over time, with the hangs and restarts marked."""
    events = [(r, at) for r in files.events if r.get("event") in ("hang", "restart")
              for at in [epoch_of(r.get("time"))] if at is not None]
    found = buckets(files, [at for _, at in events])
    if found is None:
        return ('<p class="empty" data-empty="step-time">No per-rank step times '
                f"({STEP_TIMES}/rank*.jsonl): a script, or a trainer older than this "
                "report.</p>")
    grid, start = found
    slow = slow_ranks(files)
    grid.rows[:] = [f"{label} (slow)" if r in slow else label
                    for r, label in zip(grid.ids, grid.rows)]
    marks = [Marker(at - start, f"{r['event']} (attempt {r.get('attempt')})", r["event"],
                    HANG if r["event"] == "hang" else RESTART) for r, at in events]
    named = ", ".join(f"rank {r}" for r in slow) or "none"
    return (charts.heat_map("step-time", "median step work per rank (ms), over time", grid,
                            marks)
            + f'<p data-stragglers="{escape(",".join(map(str, slow)))}">Stragglers (median step '
            f"work more than {stragglers.MARGIN:.0%} above the median rank's): {named}. "
            "A step's work runs from the end of the last optimizer step to its last backward "
            "(data and forward); grey: no steps then (a hang, a restart).</p>")


def stamp(seconds: float) -> str:
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):  # a clock far out of range
        return f"{seconds:g} s since the epoch"


# -- the timeline -----------------------------------------------------------------------------

def stack_links(files: RunFiles, attempt: Any, culprits: list[Any], out_dir: Path) -> str:
    """Links to the stacks of a hang's attempt, its culprits' first (relative hrefs)."""
    folder = f"hangs/attempt{attempt}/"
    names = [s for s in files.stacks if s.startswith(folder)]
    first = {f"{folder}node{c.get('node')}-rank{c.get('rank')}.txt" for c in culprits
             if isinstance(c, dict)}
    names.sort(key=lambda s: (s not in first, s))
    if not names:
        return '<span class="empty">no stack files</span>'
    return "stacks: " + ", ".join(
        f'<a href="{escape(os.path.relpath(files.run_dir / s, out_dir))}" '
        f'data-stack="{escape(s)}"{" data-culprit-stack" if s in first else ""}>'
        f"{escape(Path(s).name)}</a>" for s in names)


def event_item(files: RunFiles, r: dict[str, Any], out_dir: Path) -> str:
    """One ledger line, in words."""
    kind, when = str(r.get("event")), escape(str(r.get("time", "?")))
    if kind == "round":
        nodes = r.get("nodes")
        count = len(nodes) if isinstance(nodes, list) else nodes
        text = (f"{r.get('round')}: {count} node(s), world size {r.get('world_size')}, "
                f"attempt {r.get('attempt')}, from {r.get('checkpoint') or 'the start'}")
    elif kind == "restart":
        how = r.get("signal") or f"exit {r.get('exit')}"
        text = (f"after attempt {r.get('attempt')}: {r.get('cause')} (node "
                f"{r.get('node')}, rank {r.get('rank')}, {how}; step {r.get('step')} reached; "
                f"resumes from {r.get('checkpoint') or 'the start'})")
    elif kind == "hang":
        found = r.get("culprits")
        culprits: list[Any] = found if isinstance(found, list) else []
        named = "; ".join(f"rank {c.get('rank')} on node {c.get('node')} ({c.get('how')})"
                          + (f" at {c['frame']}" if c.get("frame") else "")
                          for c in culprits if isinstance(c, dict))
        ranks = ",".join(str(c.get("rank")) for c in culprits if isinstance(c, dict))
        return (f'<li class="hang" data-event="hang" data-culprit-ranks="{escape(ranks)}">'
                f"{when} <b>hang</b> in attempt {escape(str(r.get('attempt')))}: culprit "
                f"{escape(named or 'not told apart')}; waiting for it: rank(s) "
                f"{escape(str(r.get('waiting') or 'none'))}. "
                f"{stack_links(files, r.get('attempt'), culprits, out_dir)}</li>")
    elif kind == "storm":
        text = f"{r.get('restarts')} restarts in a row back to {r.get('checkpoint')}: " \
               f"stopped ({r.get('cause')})"
    else:
        text = json.dumps(r, default=str)
    return (f'<li class="{escape(kind)}" data-event="{escape(kind)}">{when} '
            f"<b>{escape(kind)}</b> {escape(text)}</li>")


def timeline(files: RunFiles, out_dir: Path) -> str:
    """The ledger's rounds, restarts, hangs and storms, in order; the membership changes."""
    if not files.events:
        return ('<p class="empty" data-empty="timeline">No ledger.jsonl: this run had no '
                "agent (or ran before the ledger existed).</p>")
    runs = list(dict.fromkeys(str(r.get("run")) for r in files.events))
    items = []
    for run in runs:
        mine = [r for r in files.events if str(r.get("run")) == run]
        if len(runs) > 1:
            items.append(f"<li><b>run {escape(run)}</b></li>")
        items += [event_item(files, r, out_dir) for r in mine]
    changes = [c for run in runs for c in ledger.membership(files.events, run)]
    members = "".join(f'<li data-event="membership">{escape(c)}</li>' for c in changes) or \
        '<li class="empty">no node left or joined</li>'
    return (f'<ol id="timeline" data-runs="{len(runs)}">{"".join(items)}</ol>'
            f'<h3>Membership changes</h3><ul id="membership">{members}</ul>')


# -- the page ---------------------------------------------------------------------------------

def headline(files: RunFiles) -> str:
    """The run's name, state and final figures."""
    rec, summary = files.record, files.summary
    name = rec.get("name") or files.run_dir.name
    state = rec.get("state") or summary.get("state") or "?"
    code = rec.get("exit_code")
    figures = {k: v for k, v in summary.items()
               if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                      for k, v in figures.items())
    return (f"<h1>Run report: {escape(str(name))}</h1><p id=\"headline\">"
            f"{escape(str(rec.get('backend', '')) + ':' + str(rec.get('id')) if rec else '')} "
            f"<b>{escape(str(state))}</b>"
            f"{escape(f' (exit code {code})' if code is not None else '')}. "
            f"{escape(shown)}</p><p>Run directory: <code>{escape(str(files.run_dir))}</code></p>")


def page(files: RunFiles, out_dir: Path) -> str:
    """The whole report; links to stack files are relative to ``out_dir``, where it is kept."""
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; img-src data:\">"
            f"<title>torchjob report: {escape(files.run_dir.name)}</title>"
            f"<style>{STYLE}</style></head><body>{headline(files)}"
            f'<h2 id="curves">Loss and evaluation</h2>{curves(files)}'
            f'<h2 id="step-times">Step time per rank</h2>{heat(files)}'
            f'<h2 id="restarts">Rounds, restarts and hangs</h2>{timeline(files, out_dir)}'
            f'<h2 id="setup">Spec and environment</h2>'
            f"{setup_section(files.record, files.manifest, files.summary)}"
            "</body></html>\n")


def write(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default RUN_DIR/report.html); its path."""
    files = load(run_dir)
    target = out if out is not None else run_dir / REPORT
    if target.is_dir():
        target = target / REPORT
    try:
        target.write_text(page(files, target.resolve().parent))
    except OSError as exc:
        raise UserError(f"{target}: cannot write the report ({exc.strerror}); give another "
                        "place with -o FILE") from None
    return target

"""A job's progress for ``torchjob status`` (core: the same on every backend), read from its run
directory where this machine sees it (local, docker, Slurm), else from its nodes' logs
(Kubernetes pods, TorchX): step of total, epoch, throughput, last loss and evaluation, ETA,
restarts so far, and the cause of the last failure. Pure but for ``from_run_dir``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from torchjob.trainer import ledger
from torchjob.jobs.report import read_json
from torchjob.trainer.contract import (CLOSING_RE, HANG_ACTION, HANG_LINE, HEARD_RESTART,
                                       LOG_PREFIX_RE, parse_counted)
from torchjob.trainer.failures import RESTARTING
from torchjob.trainer.pace import PROGRESS_FILE
from torchjob.trainer.report import clock_text, parse_eval, parse_progress

TAIL_BYTES = 256 * 1024  # of metrics.jsonl: its last train and eval lines are in it
CLOCK_SLACK_S = 5.0  # the nodes' clocks against the submitting machine's (one host, or NTP)
RESTART_LINE = "torchjob: "


@dataclass(frozen=True)
class Progress:
    """What a job has done so far; None where it is not known (a script tells less)."""

    step: int | None = None
    total_steps: int | None = None
    epoch: int | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    steps_per_s: float | None = None  # a script's pace (no samples known)
    loss: float | None = None
    eval: Mapping[str, float] = field(default_factory=dict)  # the last evaluation's figures
    eval_step: int | None = None
    eta: float | None = None  # seconds left, as of ``updated`` (or of the last line)
    restarts: int = 0
    culprit: str = ""  # why the workers last failed: a restart's, a hang's or the job's cause
    updated: float | None = None  # when the newest figure was written (seconds since the epoch)
    source: str = ""  # the run directory, or "logs"
    # a job array's tasks, each with its own (the array itself has no step of its own)
    tasks: Mapping[str, Progress] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "eval": dict(self.eval),
                "tasks": {task: told.as_json() for task, told in self.tasks.items()}}

    def now(self, now: float, running: bool) -> Progress:
        """As of ``now``: the ETA less the time since it was written while the job runs;
        none once it has ended."""
        tasks = {task: told.now(now, running) for task, told in self.tasks.items()}
        if not running:
            return dataclasses.replace(self, eta=None, tasks=tasks)
        if self.eta is None or self.updated is None:
            return dataclasses.replace(self, tasks=tasks) if tasks else self
        return dataclasses.replace(self, eta=aged(self.eta, self.updated, now), tasks=tasks)

    def lines(self, now: float) -> list[str]:
        """Its words for ``torchjob status``: a line of where the job is, a line of figures,
        a line of restarts and the last cause."""
        out: list[str] = []
        where = []
        if self.step is not None:
            where.append(f"step {self.step}" + (
                f"/{self.total_steps} ({100 * self.step / self.total_steps:.0f}%)"
                if self.total_steps else ""))
        if self.epoch is not None:
            where.append(f"epoch {self.epoch}")
        for value, unit in ((self.samples_per_s, "samples/s"), (self.tokens_per_s, "tokens/s"),
                            (self.steps_per_s, "steps/s")):
            if value:
                where.append(f"{value:.4g} {unit}")
        if self.eta is not None:
            where.append(f"ETA {clock_text(self.eta)}")
        if where:
            ago = f" (updated {max(0, int(now - self.updated))} s ago)" \
                if self.updated is not None else ""
            out.append("progress: " + ", ".join(where) + ago)
        figures = [f"loss {self.loss:.4g}"] if self.loss is not None else []
        if self.eval:
            at = f" at step {self.eval_step}" if self.eval_step is not None else ""
            figures.append(f"eval{at}: " + ", ".join(f"{k} {v:.4g}" for k, v in self.eval.items()))
        if figures:
            out.append("; ".join(figures))
        if self.restarts or self.culprit:
            out.append(f"restarts: {self.restarts}"
                       + (f"; the last failure: {self.culprit}" if self.culprit else ""))
        for task, told in self.tasks.items():
            out.append(f"{task}: " + ("; ".join(told.lines(now)) or "no progress yet"))
        return out


def aged(eta: float, said_at: float, later: float) -> float:
    """An ETA said at ``said_at``, as of ``later``: less the time between (never below 0; a
    ``later`` before ``said_at``, another clock's, takes nothing off)."""
    return max(0.0, eta - max(0.0, later - said_at))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _whole(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def tail_records(file: Path, size: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The JSON lines in the last ``size`` bytes of ``file`` (a line cut by the offset, or by
    a kill, is left out); [] when it is not there."""
    try:
        with open(file, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            start = max(0, fh.tell() - size)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    return ledger.parse_lines(lines[1:] if start else lines)


def culprit_of(event: Mapping[str, Any]) -> str:
    """A ledger line's cause in words: a restart's (or a storm's) cause, a hang's culprits."""
    if event.get("event") == "hang":
        found = event.get("culprits")
        named = ", ".join(f"rank {c.get('rank')} on node {c.get('node')} ({c.get('how')})"
                          for c in found if isinstance(c, dict)) \
            if isinstance(found, list) else ""
        return f"hang: {named or event.get('why', '?')}"
    return str(event.get("cause", "?"))


def wall_time(value: Any) -> float:
    """A record's ``time``: seconds since the epoch, or the ledger's ISO text; 0 if neither."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return 0.0
    return _number(value) or 0.0


def from_ledger(run_dir: Path, since: float) -> tuple[int, str]:
    """The newest run's restarts in the run directory's ledger (of its lines written at or
    after ``since``), and its last failure's cause."""
    records = [r for r in ledger.read(run_dir) if wall_time(r.get("time")) >= since]
    runs = [r["run"] for r in records if r.get("run") is not None]
    if not runs:
        return 0, ""
    run_id = str(runs[-1])
    failures = [r for r in records if r.get("run") == run_id
                and r.get("event") in ("restart", "hang", "storm")]
    if not failures:
        return ledger.restarts(records, run_id), ""
    last = failures[-1]  # of a round's restart lines, the first-hand one (not "membership")
    same = [r for r in failures if r.get("event") == last.get("event") == "restart"
            and r.get("round") == last.get("round") and not r.get("membership")]
    return ledger.restarts(records, run_id), culprit_of(same[0] if same else last)


def from_run_dir(run_dir: str | os.PathLike[str], since: float | None = None,
                 ) -> Progress | None:
    """What ``run_dir`` tells of the job submitted at ``since`` (what an earlier run of the same
    directory wrote is left out): the trainer's last train and eval lines (metrics.jsonl), node
    0's agent's count for a script (progress.json, trainer.pace), and the ledger's restarts;
    None when it holds none of them (the job has not started)."""
    folder, since = Path(run_dir), (since or 0.0) - CLOCK_SLACK_S
    records = [r for r in tail_records(folder / "metrics.jsonl")
               if wall_time(r.get("time")) >= since]
    train: dict[str, Any] = next((r for r in reversed(records) if r.get("kind") == "train"), {})
    scored: dict[str, Any] = next((r for r in reversed(records) if r.get("kind") == "eval"), {})
    pace = [r for r in tail_records(folder / PROGRESS_FILE, 4096)
            if wall_time(r.get("time")) >= since]
    told = pace[-1] if pace else {}
    restarts, culprit = from_ledger(folder, since)
    try:  # the agent's summary of a run that failed (a script's, or the trainer's): its cause
        summary = read_json(folder / "summary.json") \
            if (folder / "summary.json").stat().st_mtime >= since else {}
    except OSError:
        summary = {}
    if isinstance(summary.get("failure"), str):
        culprit = summary["failure"]
    if not (train or scored or told or restarts or culprit):
        return None
    # the newer of the two counts: the agent sees every step, the trainer logs every few
    newest = told if (_number(told.get("time")) or 0) > (_number(train.get("time")) or 0) \
        else train
    step = _whole(newest.get("step"))
    total = _whole(train.get("total_steps")) or _whole(told.get("total_steps"))
    pace_s = _number(told.get("steps_per_s"))
    updated = _number(newest.get("time"))
    eta = _number(train.get("eta_s"))  # the trainer's, as of its line: made as of ``updated``
    if eta is not None:
        eta = aged(eta, _number(train.get("time")) or 0.0, updated or 0.0)
    elif total and step is not None and pace_s:
        eta = max(0, total - step) / pace_s
    evaluation = {k: float(v) for k, v in scored.items()
                  if k not in ("kind", "time", "step", "epoch") and _number(v) is not None}
    return Progress(
        step=step, total_steps=total, epoch=_whole(train.get("epoch")),
        samples_per_s=_number(train.get("samples_per_s")),
        tokens_per_s=_number(train.get("tokens_per_s")),
        steps_per_s=pace_s if not train else None, loss=_number(train.get("loss")),
        eval=evaluation, eval_step=_whole(scored.get("step")), eta=eta, restarts=restarts,
        culprit=culprit, updated=updated or _number(scored.get("time")),
        source=str(folder))


class FromLogs:
    """Progress from a job's log lines, seen one at a time (any backend's prefixes): the
    trainer's progress and evaluation lines (trainer.report), node 0's agent's count of the
    steps (a script's, trainer.pace), the attempt in each worker's prefix, the agents' restart,
    hang and closing lines."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}
        self.eval: dict[str, float] = {}
        self.eval_step: int | None = None
        self.attempt = 0
        self.culprit = ""
        self.hang = False  # the last failure line was a hang's: its restart line says less
        self.seen = False
        self.updated: float | None = None  # when the last figure's line was written, if told
        self.figures_at: float | None = None  # when the last progress line was
        self.counted: dict[str, float | None] = {}  # node 0's agent's last (parse_counted)
        self.counted_last = False  # it came after the trainer's last progress line

    def see(self, line: str, at: float | None = None) -> None:
        """One line; ``at``: when it was written, where the log says (Kubernetes' stamps)."""
        text = line
        if (prefixed := LOG_PREFIX_RE.search(line[:200])) is not None:
            self.attempt = max(self.attempt, int(prefixed["attempt"]))
            text = line[prefixed.end():]
        if (counted := parse_counted(text)) is not None:
            self.counted, self.counted_last = counted, True
            self.updated = at if at is not None else self.updated
        elif (found := parse_progress(text)) is not None:
            self.figures, self.updated, self.figures_at = found, at, at
            self.counted_last = False
        elif (scored := parse_eval(text)) is not None:
            self.eval_step = _whole(scored.pop("step", self.figures.get("step")))
            self.eval, self.updated = scored, at if at is not None else self.updated
        elif (closing := CLOSING_RE.search(text)) is not None:
            if not closing["heard"]:
                self.culprit, self.hang = closing["what"], False
        elif HANG_LINE in text:
            self.culprit = "hang: " + text.split(HANG_LINE, 1)[1].split(": ", 1)[-1] \
                .split(HANG_ACTION, 1)[0]
            self.hang = True
        elif text.rstrip().endswith(RESTARTING) and RESTART_LINE in text:
            why = text.split(RESTART_LINE, 1)[1].rstrip().removesuffix(RESTARTING)
            if not why.startswith(HEARD_RESTART) and not self.hang:
                self.culprit = why
            self.hang = False
        else:
            return
        self.seen = True

    def progress(self) -> Progress | None:
        if not (self.seen or self.attempt):
            return None
        f, counted = self.figures, self.counted
        # the newer of the two counts, as from_run_dir takes them
        step = _whole((counted if self.counted_last or not f else f).get("step"))
        total = _whole(f.get("total_steps")) or _whole(counted.get("total_steps"))
        pace = None if f else counted.get("steps_per_s") or None  # a script's (no figures)
        eta = f.get("eta_s")  # as of its line: made as of ``updated``, as from_run_dir's
        if eta is not None and self.updated is not None and self.figures_at is not None:
            eta = aged(eta, self.figures_at, self.updated)
        elif total and step is not None and pace:
            eta = max(0, total - step) / pace
        return Progress(
            step=step, total_steps=total, epoch=_whole(f.get("epoch")),
            samples_per_s=f.get("samples_per_s"), tokens_per_s=f.get("tokens_per_s"),
            steps_per_s=pace, loss=f.get("loss"), eval=self.eval, eval_step=self.eval_step,
            eta=eta, restarts=self.attempt, culprit=self.culprit, updated=self.updated,
            source="logs")


def from_logs(lines: Iterable[str]) -> Progress | None:
    """Progress from every line of a job's logs (``FromLogs``)."""
    return from_stamped_logs((None, line) for line in lines)


def from_stamped_logs(lines: Iterable[tuple[float | None, str]]) -> Progress | None:
    """Progress from every line of a job's logs, each with when it was written where the
    log tells (else None): the ETA is then as of its line, and ages."""
    reader = FromLogs()
    for at, line in lines:
        reader.see(line, at)
    return reader.progress()

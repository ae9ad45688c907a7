"""What the trainer tells people: log lines with the rank, a progress bar on a terminal, metrics
as JSON lines, a summary and a plot in the run directory (the loss, and the task's other
evaluation metric: accuracy, or a language model's perplexity).

Every rank-0-only effect goes through :meth:`Reporter.main` or the methods built on it, so no
``if rank == 0`` is scattered through the training loop.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, TypeVar

from torchjob.trainer import ledger
from torchjob.trainer.dirs import write_whole, writing
from torchjob.trainer.exporters import Exporters

T = TypeVar("T")
STEP_TIMES = "step_times"  # RUN_DIR/step_times/rank<R>.jsonl: each rank's step work over time

# The plain progress line, for people and for ``torchjob status`` where only the logs can be
# read (Kubernetes pods, TorchX): ``step 40/100 loss 0.5123 lr 0.001 epoch 1 samples/s 1234
# eta 0:00:12``; and the evaluation's ``eval at step 40: loss 0.2140 accuracy 0.9400``.
WORDS = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "eta_s": "eta"}
KEYS = {word: key for key, word in WORDS.items()}
PROGRESS_RE = re.compile(r"(?:^|\s)step (?P<step>\d+)/(?P<total>\d+)(?P<rest>(?: \S+ \S+)*)\s*$")
EVAL_RE = re.compile(r"(?:^|\s)eval (?P<when>[^:]*): (?P<rest>\S+ \S+(?: \S+ \S+)*)\s*$")


def clock_text(seconds: float) -> str:
    """``0:00:12``, ``27:46:40``: hours, minutes, seconds."""
    whole = int(round(max(0.0, seconds)))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def progress_line(step: int, total: int, values: Mapping[str, float | None]) -> str:
    """The plain progress line; a value of None is left out."""
    words = [f"step {step}/{total}"]
    for key, value in values.items():
        if value is not None:
            shown = clock_text(value) if key == "eta_s" else f"{value:.4g}"
            words.append(f"{WORDS.get(key, key)} {shown}")
    return " ".join(words)


def _number(word: str) -> float | None:
    try:
        if word.count(":") == 2:
            hours, minutes, seconds = word.split(":")
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        return float(word)
    except ValueError:
        return None


def _pairs(rest: str) -> dict[str, float]:
    words = rest.split()
    found = {KEYS.get(k, k): _number(v) for k, v in zip(words[::2], words[1::2])}
    return {k: v for k, v in found.items() if v is not None}


def parse_progress(line: str) -> dict[str, float] | None:
    """A progress line's figures (``step``, ``total_steps``, ``loss``, ``epoch``,
    ``samples_per_s``, ``eta_s``, ...) wherever it sits in ``line``; None if it is not one."""
    found = PROGRESS_RE.search(line)
    if found is None:
        return None
    return {"step": int(found["step"]), "total_steps": int(found["total"]),
            **_pairs(found["rest"])}


def parse_eval(line: str) -> dict[str, float] | None:
    """An evaluation line's figures (``loss``, ``accuracy``, ...; ``step`` when it says ``at
    step N``); None if it is not one."""
    found = EVAL_RE.search(line)
    if found is None:
        return None
    at = re.fullmatch(r"at step (\d+)", found["when"].strip())
    return {**_pairs(found["rest"]), **({"step": int(at[1])} if at else {})}


class Reporter:
    def __init__(self, run_dir: str, *, rank: int, world_size: int, progress: str,
                 log_every: int, exporters: Exporters | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.exporters = exporters
        self.run_dir = Path(run_dir)
        self.log_every = log_every
        self.log = logging.getLogger(f"trainer.rank{rank}")
        if not self.log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(
                f"%(asctime)s [rank {rank}/{world_size}] %(message)s", "%H:%M:%S"))
            self.log.addHandler(handler)
            self.log.setLevel(logging.INFO)
            self.log.propagate = False
        self.use_bar = rank == 0 and (progress == "bar" or
                                      (progress == "auto" and sys.stderr.isatty()))
        self._bar: Any = None
        if rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)

    # -- the one rank-0 gate ------------------------------------------------------------------

    def main(self, effect: Callable[[], T]) -> T | None:
        """Run ``effect`` on rank 0 only (writing files, printing once for the job)."""
        return effect() if self.rank == 0 else None

    def say(self, message: str) -> None:
        """One line for the whole job, from rank 0."""
        self.main(lambda: self._write(message))

    def every_rank(self, message: str) -> None:
        """A line from each rank (things that differ per rank, such as errors)."""
        self._write(message)

    def _write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            self.log.info(message)

    # -- metrics ------------------------------------------------------------------------------

    def metric(self, kind: str, **values: Any) -> None:
        """Append one JSON line to RUN_DIR/metrics.jsonl (rank 0), and hand it to this
        worker's exporters (trainer.exporters: rank 0's, a node's first worker's)."""
        record = {"kind": kind, "time": round(time.time(), 3), **values}
        if self.exporters is not None:
            self.exporters.record(record)

        def write() -> None:
            with writing(self.run_dir / "metrics.jsonl"):
                with open(self.run_dir / "metrics.jsonl", "a") as fh:
                    fh.write(json.dumps(record) + "\n")
        self.main(write)

    def step_times(self, step: int, restart: int, times: dict[str, float]) -> None:
        """Append this rank's step work since its last line (trainer.stragglers' percentiles)
        to RUN_DIR/step_times/rank<R>.jsonl, on every rank: the run report's heat map. Best
        effort: a file that cannot be written never stops training."""
        record = {"time": round(time.time(), 3), "step": step, "restart": restart, **times}
        try:
            folder = self.run_dir / STEP_TIMES
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"rank{self.rank}.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
        except OSError:
            pass

    def progress(self, step: int, total: int, more: Mapping[str, float | None] | None = None,
                 **shown: float) -> None:
        """Advance the bar (``shown`` beside it), or print a plain line (``progress_line``:
        ``shown`` and ``more``) every ``log_every`` steps."""
        if self.use_bar:
            if self._bar is None:
                from tqdm import tqdm
                self._bar = tqdm(total=total, initial=step - 1, file=sys.stderr,
                                 dynamic_ncols=True, desc="train")
            self._bar.update(1)
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=False)
        elif step % self.log_every == 0 or step == total:
            self.say(progress_line(step, total, {**shown, **(more or {})}))

    def close(self) -> None:
        if self.exporters is not None:
            self.exporters.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # -- end of run ---------------------------------------------------------------------------

    def finish(self, summary: dict[str, Any], *lines: str) -> None:
        """Write summary.json and plot.png, and print the summary (rank 0): its plain values
        on the last line, after ``lines`` (a nested part said in words)."""
        def write() -> None:
            self.close()
            with writing(self.run_dir / "summary.json"):
                write_whole(self.run_dir / "summary.json", json.dumps(
                    {**summary, **history(self.run_dir)}, indent=1) + "\n",
                    self.run_dir / ".summary.json.part")
            with writing(self.run_dir / "plot.png"):
                plot(self.run_dir / "metrics.jsonl", self.run_dir / "plot.png")
            for text in lines:
                self.log.info(text)
            shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in summary.items() if not isinstance(v, dict))
            self.log.info(f"done: {shown}; see {self.run_dir}/summary.json and plot.png")
        self.main(write)


def history(run_dir: Path) -> dict[str, Any]:
    """This run's restarts and changes of membership, from the agent's ledger
    (trainer.ledger; the run is torchrun's ``TORCHELASTIC_RUN_ID``): empty without an agent."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    records = ledger.read(run_dir)
    if run_id is None or not records:
        return {}
    return {"restarts": ledger.restarts(records, run_id),
            "membership": ledger.membership(records, run_id),
            "hangs": ledger.hangs(records, run_id)}


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (NaN is one: a loss that diverged)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Metrics lines, keeping the last record per (kind, step): a resumed run repeats steps.
    A line cut short, or without a word ``kind`` and a whole ``step``, is left out, and so is
    a value that is not a number (null, ``"n/a"``)."""
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for rec in ledger.read_lines(path):
        kind, step = rec.get("kind"), rec.get("step")
        if isinstance(kind, str) and isinstance(step, int) and not isinstance(step, bool):
            latest[(kind, step)] = {"kind": kind, **{k: v for k, v in rec.items()
                                                     if is_number(v)}}
    return sorted(latest.values(), key=lambda r: (r["step"], r["kind"]))


NOT_A_SCORE = ("kind", "time", "step", "epoch", "loss")


def plot(metrics: Path, out: Path) -> None:
    """Train and eval loss on the left; on the right the evaluation's other metric, whichever
    the task reports (torchjob.trainer.objectives): accuracy, or a language model's perplexity."""
    from matplotlib.figure import Figure  # not pyplot: no backend to choose, nothing to close

    records = read_metrics(metrics)
    train = [r for r in records if r["kind"] == "train" and "loss" in r]
    evals = [r for r in records if r["kind"] == "eval"]
    score = next((k for r in evals for k in r if k not in NOT_A_SCORE), "accuracy")
    fig = Figure(figsize=(10, 4))
    ax_loss, ax_score = fig.subplots(1, 2)
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    losses = [r for r in evals if "loss" in r]
    ax_loss.plot([r["step"] for r in losses], [r["loss"] for r in losses], "o-", label="eval")
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_loss.legend()
    scored = [r for r in evals if score in r]
    ax_score.plot([r["step"] for r in scored], [r[score] for r in scored], "o-")
    ax_score.set(xlabel="step", ylabel=score, title=f"eval {score}")
    if score == "accuracy":
        ax_score.set(ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(out, dpi=80)

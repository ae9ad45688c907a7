"""A Prometheus text-format file per node, for a node exporter's textfile collector
(``--collector.textfile.directory``): each node's local rank 0 rewrites
``DIR/torchjob_JOB_node<N>.prom`` at every metrics record, atomically (a temporary name, then a
rename), with its step, loss, learning rate, throughput, the last evaluation's scores, the
run's restarts and last hang (from the ledger, read once at start), and the time of the update.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from pathlib import Path
from typing import Any

from torchjob.trainer import ledger
from torchjob.trainer.dirs import write_whole

PREFIX = "torchjob_"
# record key -> (metric name, help); eval scores not listed become torchjob_eval_<key>
TRAIN = {"step": ("step", "The last optimizer step this node's first worker logged."),
         "loss": ("train_loss", "Training loss of this node's first worker since its last log."),
         "lr": ("learning_rate", "Learning rate at the last logged step."),
         "samples_per_s": ("samples_per_second", "Training samples per second, whole job."),
         "total_steps": ("total_steps", "The optimizer steps the run will take in all."),
         "eta_s": ("eta_seconds", "Seconds left at the pace since the warm-up, as of the "
                   "last logged step.")}


def metric_name(key: str) -> str:
    """A Prometheus metric name from a record key: ``torchjob_`` and [a-zA-Z0-9_] only."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**values: Any) -> str:
    return "{" + ",".join(f'{k}="{label_value(str(v))}"' for k, v in values.items()) + "}"


def number(value: float) -> str:
    """A sample value as the text format writes it (NaN, +Inf, -Inf)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)


class Prometheus:
    """The exporter (trainer.exporters): one file, rewritten whole at each record."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.gauges: dict[str, tuple[str, str, float]] = {}  # name -> (help, labels, value)
        self.path = self.folder / "unset.prom"
        self.labels = ""

    def start(self, run: Any) -> None:
        job = Path(run.run_dir).name or "run"
        self.labels = labels(job=job, node=run.node, rank=run.rank)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job)
        self.path = self.folder / f"torchjob_{safe}_node{run.node}.prom"
        self.folder.mkdir(parents=True, exist_ok=True)
        records = ledger.read(run.run_dir)
        runs = [r for r in records if not run.run_id or r.get("run") == run.run_id]
        self.set("restarts", "Restarts of the worker group so far in this run (the ledger).",
                 sum(r.get("event") == "restart" for r in runs))
        hangs = [r for r in runs if r.get("event") == "hang"]
        self.set("hangs", "Hangs detected so far in this run (the ledger).", len(hangs))
        if hangs:
            self.last_hang(hangs[-1])
        self.write()

    def last_hang(self, hang: dict[str, Any]) -> None:
        culprits = hang.get("culprits") or [{}]
        first = culprits[0] if isinstance(culprits[0], dict) else {}
        try:
            when = float(calendar.timegm(time.strptime(hang.get("time", ""),
                                                       "%Y-%m-%dT%H:%M:%SZ")))
        except (TypeError, ValueError):
            when = float("nan")
        extra = labels(culprit_rank=first.get("rank", ""), culprit_node=first.get("node", ""))
        self.gauges[metric_name("last_hang_timestamp_seconds")] = (
            "When the last hang was detected (Unix time); labels name its culprit.",
            self.labels[:-1] + "," + extra[1:], when)

    def set(self, key: str, help: str, value: float) -> None:
        self.gauges[metric_name(key)] = (help, self.labels, float(value))

    def record(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        for key, value in record.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if kind == "train" and key in TRAIN:
                self.set(*TRAIN[key], value)
            elif kind == "eval" and key not in ("time", "step", "epoch"):
                self.set(f"eval_{key}", f"The last evaluation's {key}.", value)
        if kind == "eval":
            self.set("eval_step", "The step of the last evaluation.", record["step"])
        self.set("last_update_timestamp_seconds", "When this file was last written (Unix "
                 "time).", record.get("time", time.time()))
        self.write()

    def text(self) -> str:
        lines = []
        for name, (help, where, value) in sorted(self.gauges.items()):
            lines += [f"# HELP {name} {help}", f"# TYPE {name} gauge", f"{name}{where} {number(value)}"]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        """Atomically: the collector never reads half a file (the temporary name is no .prom)."""
        write_whole(self.path, self.text(),
                    self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp"))

    def close(self) -> None:
        """The file stays: the last values of a finished run."""

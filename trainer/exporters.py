"""Metrics exporters: each gets the records RUN_DIR/metrics.jsonl gets, between ``start`` and
``close``. Built in: TensorBoard event files (``--tensorboard``, rank 0) and a Prometheus
text file per node (``--prometheus-dir``, each node's local rank 0, trainer.prometheus); a
user's own by dotted path (``--exporters pkg.module:Class``, rank 0). Best effort once started:
an exporter that raises is dropped with one line, and training goes on.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from torchjob.trainer.config import ConfigError, TrainConfig

TENSORBOARD_DIR = "tensorboard"  # RUN_DIR/tensorboard: the event files
NOT_A_SCALAR = ("kind", "time", "step", "epoch", "restart", "total_steps")


@dataclass(frozen=True, kw_only=True)
class Run:
    """What an exporter is told at its start: where it runs and the trainer's options."""

    run_dir: str
    run_id: str  # torchrun's TORCHELASTIC_RUN_ID ('' alone)
    rank: int
    local_rank: int
    node: int
    world_size: int
    config: dict[str, Any]


class Exporter(Protocol):
    """A metrics exporter. ``record``'s argument is one metrics.jsonl line: ``kind`` (train or
    eval), ``time``, ``step``, ``epoch`` and the values (loss, lr, samples_per_s, accuracy or
    perplexity, ...). Built once per worker with no arguments."""

    def start(self, run: Run) -> None: ...

    def record(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record's plotted values: ``{"train/loss": ..., "eval/accuracy": ...}``."""
    return {f"{record['kind']}/{key}": float(value) for key, value in record.items()
            if key not in NOT_A_SCALAR and isinstance(value, (int, float))
            and not isinstance(value, bool)}


class TensorBoard:
    """Event files under RUN_DIR/tensorboard: each record's scalars at its step."""

    def __init__(self) -> None:
        self.writer: Any = None

    def start(self, run: Run) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the tensorboard package: lazily
        self.writer = SummaryWriter(os.path.join(run.run_dir, TENSORBOARD_DIR), flush_secs=10)

    def record(self, record: dict[str, Any]) -> None:
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, record["step"], walltime=record["time"])
        if record["kind"] == "eval":
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def need(package: str, extra: str, option: str) -> None:
    """Refuse (exit 2) an option whose package is missing, naming the install."""
    try:
        importlib.import_module(package)
    except ImportError:
        raise ConfigError(f"{option} needs the {package} package, which this Python lacks: "
                          f"pip install torchjob[{extra}] (or pip install {package})") from None


def load(path: str) -> Callable[[], Exporter]:
    """The exporter class (or factory) named ``pkg.module:Name``; a ConfigError saying why not."""
    module, _, name = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(f"--exporters {path}: cannot import {module}: {exc}") from None
    except AttributeError:
        raise ConfigError(f"--exporters {path}: {module} has no {name}") from None
    if not callable(found):
        raise ConfigError(f"--exporters {path}: {name} is not a class or factory")
    return found


class Exporters:
    """This worker's exporters, started; records go to each until it fails or is closed."""

    def __init__(self, exporters: list[Exporter], say: Callable[[str], None]) -> None:
        self.exporters, self.say = exporters, say

    def record(self, record: dict[str, Any]) -> None:
        for exporter in list(self.exporters):
            try:
                exporter.record(dict(record))
            except Exception as exc:  # an exporter never stops training
                self.exporters.remove(exporter)
                self.say(f"metrics exporter {type(exporter).__name__} failed and is dropped: "
                         f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        exporters, self.exporters = self.exporters, []
        for exporter in exporters:
            try:
                exporter.close()
            except Exception as exc:
                self.say(f"metrics exporter {type(exporter).__name__} failed to close: {exc}")


def build(cfg: TrainConfig, run: Run, say: Callable[[str], None]) -> Exporters:
    """The exporters this worker runs, started. Every rank checks packages and imports alike,
    so a missing one stops every rank with exit 2 before training."""
    if cfg.tensorboard:
        need("tensorboard", "tensorboard", "--tensorboard")
    factories = [load(path) for path in paths(cfg.exporters)]
    chosen: list[Exporter] = []
    if run.rank == 0:
        chosen += [TensorBoard()] if cfg.tensorboard else []
        chosen += [factory() for factory in factories]
    if run.local_rank == 0 and cfg.prometheus_dir:
        from torchjob.trainer.prometheus import Prometheus
        chosen.append(Prometheus(cfg.prometheus_dir))
    started: list[Exporter] = []
    try:
        for exporter in chosen:
            exporter.start(run)
            started.append(exporter)
    except Exception as exc:
        Exporters(started, say).close()
        raise ConfigError(f"metrics exporter {type(exporter).__name__} cannot start: "
                          f"{type(exc).__name__}: {exc}") from None
    return Exporters(started, say)


def paths(text: str) -> list[str]:
    """``--exporters``' comma-separated ``pkg.module:Name`` items."""
    return [item.strip() for item in text.split(",") if item.strip()]


def run_info(cfg: TrainConfig, *, rank: int, local_rank: int, node: int,
             world_size: int) -> Run:
    return Run(run_dir=cfg.run_dir, run_id=os.environ.get("TORCHELASTIC_RUN_ID", ""),
               rank=rank, local_rank=local_rank, node=node, world_size=world_size,
               config=dataclasses.asdict(cfg))


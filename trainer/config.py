"""The trainer's own configuration: one frozen tree, parsed once from the command line.

Precedence: defaults < command-line flags. Each field's ``help`` is the ``--help`` text, so
the documentation cannot drift from the code. The launcher side (``jobs/``) validates a job
spec's ``trainer.args`` against these same fields before anything runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Sequence

from torchjob.trainer.contract import (CHECKPOINT_BUDGET_ENV, CHECKPOINT_BUDGET_S,
                                       COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S, seconds_from)


class ConfigError(ValueError):
    """A bad trainer setting: exit code 2, never retried."""


def opt(default: Any, help: str, choices: Sequence[str] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    task: str = opt("digits", "what to train: 'digits' (scikit-learn's 8x8 digits, offline), "
                    "'synthetic' (sized by --synthetic-*), 'gpt' (a byte-level transformer on "
                    "the Python standard library's source, sized by --gpt-*), or a factory "
                    "'pkg.module:function'")
    epochs: int = opt(12, "passes over the training set")
    max_steps: int = opt(0, "stop after this many optimizer steps (0: no limit)")
    batch_size: int = opt(32, "samples per process per micro-step")
    grad_accum: int = opt(1, "micro-steps per optimizer step (all-reduce only on the last)")
    lr: float = opt(3e-3, "peak learning rate (AdamW)")
    weight_decay: float = opt(1e-4, "AdamW weight decay")
    warmup_steps: int = opt(20, "linear warm-up steps before the schedule")
    schedule: str = opt("cosine", "learning-rate schedule after warm-up",
                        ("cosine", "constant"))
    clip_grad: float = opt(1.0, "clip the gradient norm to this (0: off)")
    precision: str = opt("auto", "autocast dtype: auto (bf16 on a CUDA device that supports "
                         "it, else fp32), bf16 or fp32", ("auto", "bf16", "fp32"))
    parallel: str = opt("ddp", "data parallelism: ddp (DistributedDataParallel) or fsdp "
                        "(FSDP2 fully_shard)", ("ddp", "fsdp"))
    sync_bn: bool = opt(False, "convert BatchNorm layers to SyncBatchNorm")
    compile: bool = opt(False, "torch.compile the model (under fsdp: each block): faster "
                        "steps on a GPU after a compile of a minute or so")
    seed: int = opt(0, "seed for model init, data order and dropout")
    backend: str = opt("auto", "process-group backend: auto (nccl with CUDA, else gloo)",
                       ("auto", "nccl", "gloo"))
    pg_timeout: float = opt(float(COLLECTIVE_TIMEOUT_S), "seconds a collective may wait before "
                            "it fails (default: the job's collective_timeout)")
    eval_every: int = opt(1, "evaluate every N epochs (0: only at the end)")
    eval_every_steps: int = opt(0, "also evaluate every N optimizer steps (0: off), for "
                                "epochs too long to wait for")
    log_every: int = opt(10, "log a line every N optimizer steps")
    progress: str = opt("auto", "progress display: auto (a bar on a terminal, lines in logs), "
                        "bar, lines", ("auto", "bar", "lines"))
    run_dir: str = opt("runs/default", "where metrics, the summary and the plot go")
    checkpoint_dir: str = opt("", "checkpoint directory ('' : RUN_DIR/checkpoints)")
    checkpoint_every: int = opt(50, "checkpoint every N optimizer steps (0: only at the end "
                                "and when stopped)")
    keep_checkpoints: int = opt(3, "keep the newest N checkpoints")
    async_checkpoint: bool = opt(False, "write checkpoints in the background")
    resume: bool = opt(True, "resume from the newest checkpoint that verifies")
    stop_grace: float = opt(float(CHECKPOINT_BUDGET_S), "seconds to finish the step and "
                            "checkpoint after a stop signal before exiting without one "
                            "(default: the job's checkpoint_budget)")
    tensorboard: bool = opt(False, "write TensorBoard event files under RUN_DIR/tensorboard "
                            "(train loss, lr, samples/s; eval loss and score); needs the "
                            "tensorboard package: pip install torchjob[tensorboard]")
    prometheus_dir: str = opt("", "each node's first worker keeps a Prometheus text file "
                              "(torchjob_JOB_nodeN.prom) in this directory of its machine, for "
                              "a node exporter's textfile collector ('': off)")
    exporters: str = opt("", "your own metrics exporters, comma-separated 'pkg.module:Class' "
                         "(torchjob.trainer.exporters.Exporter): rank 0 gives each the "
                         "records of metrics.jsonl")
    profile: str = opt("", "profile optimizer steps FIRST:LAST with torch.profiler (e.g. "
                       "10:15): a Chrome trace per rank in RUN_DIR/profile/, rank 0's busiest "
                       "operators in the log ('': off)")
    log_samples: bool = opt(False, "record the dataset indices each rank trains on, per "
                            "micro-batch, in RUN_DIR/samples/ (to check a resume)")
    num_workers: int = opt(0, "DataLoader worker processes per rank")
    synthetic_samples: int = opt(8192, "synthetic task: training samples")
    synthetic_dim: int = opt(256, "synthetic task: input features")
    synthetic_hidden: int = opt(1024, "synthetic task: hidden width")
    synthetic_layers: int = opt(4, "synthetic task: hidden layers")
    synthetic_classes: int = opt(10, "synthetic task: classes")
    gpt_layers: int = opt(4, "gpt task: transformer blocks")
    gpt_heads: int = opt(4, "gpt task: attention heads per block (divides --gpt-width)")
    gpt_width: int = opt(256, "gpt task: embedding width (4 layers x 256: 3.3M parameters)")
    gpt_context: int = opt(128, "gpt task: context length in bytes (the sample: one window)")

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "grad_accum", "log_every", "keep_checkpoints",
                     "synthetic_samples", "synthetic_dim", "synthetic_hidden",
                     "synthetic_layers", "synthetic_classes", "gpt_layers", "gpt_heads",
                     "gpt_width", "gpt_context"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "warmup_steps", "eval_every", "eval_every_steps",
                     "checkpoint_every",
                     "num_workers", "lr", "weight_decay", "clip_grad", "stop_grace"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.pg_timeout <= 0:
            raise ConfigError(f"--pg-timeout must be > 0 seconds, got {self.pg_timeout}")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ConfigError(f"--{flag(f.name)} must be one of {', '.join(choices)}; "
                                  f"got {getattr(self, f.name)!r}")
        if self.task not in ("digits", "synthetic", "gpt") and ":" not in self.task:
            raise ConfigError(f"--task must be 'digits', 'synthetic', 'gpt' or "
                              f"'pkg.module:factory'; got {self.task!r}")
        for item in filter(None, (part.strip() for part in self.exporters.split(","))):
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", item):
                raise ConfigError(f"--exporters: {item!r} is not 'pkg.module:Class' (a module "
                                  "path, a colon, a class or factory in it)")
        self.profile_steps  # noqa: B018  (raises on a malformed --profile)
        if self.gpt_width % self.gpt_heads:
            raise ConfigError(f"--gpt-heads {self.gpt_heads} must divide --gpt-width "
                              f"{self.gpt_width} (each head gets width / heads): pick a "
                              "divisor of the width, or a width that is a multiple of it")

    @property
    def profile_steps(self) -> tuple[int, int] | None:
        """``--profile FIRST:LAST`` as (FIRST, LAST), 1 <= FIRST <= LAST; None when off."""
        if not self.profile:
            return None
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", self.profile)
        if match is None or not 1 <= int(match[1]) <= int(match[2]):
            raise ConfigError(f"--profile must be FIRST:LAST optimizer steps, 1 <= FIRST <= "
                              f"LAST (e.g. 10:15, a few steps after the warm-up); got "
                              f"{self.profile!r}")
        return int(match[1]), int(match[2])

    @property
    def checkpoint_path(self) -> str:
        return self.checkpoint_dir or f"{self.run_dir}/checkpoints"


def flag(name: str) -> str:
    """The command-line spelling of a field name: ``grad_accum`` -> ``grad-accum``."""
    return name.replace("_", "-")


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def field_types() -> dict[str, type]:
    """Each field's Python type (bool, int, float or str), for validators outside the trainer."""
    kinds = {"bool": bool, "int": int, "float": float, "str": str}
    return {f.name: kinds[str(f.type)] for f in dataclasses.fields(TrainConfig)}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message} (see python -m torchjob.trainer --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m torchjob.trainer",
                     description="Train with DDP under torchrun, srun, an MPI launcher, a "
                                 "Kubernetes operator or alone; the place in the world comes "
                                 "from the environment.")
    types = field_types()
    for f in dataclasses.fields(TrainConfig):
        kind = types[f.name]
        parser.add_argument(f"--{flag(f.name)}", dest=f.name, default=f.default,
                            type=_bool if kind is bool else kind,
                            choices=f.metadata.get("choices"), help=f.metadata["help"],
                            metavar=None if f.metadata.get("choices") else kind.__name__.upper())
    return parser


def parse_args(argv: Sequence[str] | None = None,
               environ: Mapping[str, str] | None = None) -> TrainConfig:
    """The one reader of the trainer's command line. ``environ`` (a worker's: its agent's
    exports) gives the defaults of --pg-timeout and --stop-grace (the job's timeouts)."""
    parser = build_parser()
    if environ is not None:
        try:
            parser.set_defaults(
                pg_timeout=seconds_from(environ, COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S),
                stop_grace=seconds_from(environ, CHECKPOINT_BUDGET_ENV, CHECKPOINT_BUDGET_S))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    ns = parser.parse_args(argv)
    return TrainConfig(**vars(ns))

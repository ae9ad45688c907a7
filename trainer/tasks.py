"""What to train: the built-in digits, synthetic and gpt tasks, or a user's factory by import path.

A task is a model, a training set, an evaluation set and its objective (torchjob.trainer.objectives:
classification unless it says otherwise). A user's factory ``pkg.module:function`` is called
with no arguments and returns a :class:`Task` (or a ``(model, train, eval)`` tuple); the
trainer adds everything distributed around it.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from torchjob.trainer import gpt
from torchjob.trainer.config import ConfigError, TrainConfig
from torchjob.trainer.objectives import CLASSIFY, NextToken, Objective

SPLIT_SEED = 1234  # the train/test split never depends on --seed: every run scores the same set


@dataclass
class Task:
    model: nn.Module
    train: Dataset
    eval: Dataset | None = None
    objective: Objective = CLASSIFY  # the loss and the evaluation's metrics
    # what FSDP2 shards one by one before the root (None: every Linear and Conv2d)
    shard_units: list[nn.Module] | None = None
    # what the data is, when it is read from the machine rather than fixed by the config
    # (the gpt task's corpus): every rank must agree, and a checkpoint remembers it
    identity: str = ""


def build_task(cfg: TrainConfig) -> Task:
    """Build the task named by ``--task``; the model is initialised from ``--seed``."""
    torch.manual_seed(cfg.seed)
    if cfg.task == "digits":
        return digits_task()
    if cfg.task == "synthetic":
        return synthetic_task(cfg)
    if cfg.task == "gpt":
        return gpt_task(cfg)
    return user_task(cfg.task)


# -- digits: scikit-learn's 8x8 handwritten digits, shipped inside its wheel -------------------

def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 1, 8, 8) scaled to [0, 1] and labels, read straight from sklearn's data file.

    Importing scikit-learn costs about a second per process; its CSV costs a few milliseconds.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("--task digits needs scikit-learn (it ships the data set): "
                          "pip install scikit-learn")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    images = (table[:, :-1] / 16.0).reshape(-1, 1, 8, 8)
    return images, table[:, -1].astype(np.int64)


def digits_task() -> Task:
    images, labels = digits_arrays()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    cut = int(0.8 * len(labels))
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    train, test = torch.from_numpy(order[:cut]), torch.from_numpy(order[cut:])
    return Task(DigitsCNN(), TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test]))


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions with BatchNorm, a pool and two linear layers: ~40k parameters."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(),
                                  nn.Dropout(0.2), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# -- synthetic: a learnable problem of any size, for benchmarks -------------------------------

def synthetic_task(cfg: TrainConfig) -> Task:
    """Gaussian inputs labelled by a fixed random linear teacher, so the loss really falls."""
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    n_eval = max(cfg.synthetic_samples // 8, 1)
    x = torch.randn(cfg.synthetic_samples + n_eval, cfg.synthetic_dim, generator=gen)
    teacher = torch.randn(cfg.synthetic_dim, cfg.synthetic_classes, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    n = cfg.synthetic_samples
    return Task(mlp(cfg.synthetic_dim, cfg.synthetic_hidden, cfg.synthetic_layers,
                    cfg.synthetic_classes),
                TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:]))


def mlp(dim: int, hidden: int, layers: int, classes: int) -> nn.Sequential:
    blocks: list[nn.Module] = []
    width = dim
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*blocks, nn.Linear(width, classes))


# -- gpt: a byte-level transformer on the standard library's own source (trainer.gpt) -----------

def gpt_task(cfg: TrainConfig) -> Task:
    corpus = gpt.stdlib_corpus()
    model = gpt.GPT(layers=cfg.gpt_layers, heads=cfg.gpt_heads, width=cfg.gpt_width,
                    context=cfg.gpt_context)
    return Task(model, gpt.windows(corpus.train, cfg.gpt_context),
                gpt.windows(corpus.eval, cfg.gpt_context),
                objective=NextToken(tokens_per_sample=cfg.gpt_context),
                shard_units=list(model.blocks), identity=corpus.identity)


# -- a user's own task -------------------------------------------------------------------------

def user_task(target: str) -> Task:
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--task {target!r}: cannot import it ({exc}); give 'pkg.module:"
                          "function' for a module on PYTHONPATH") from exc
    made = factory()
    if isinstance(made, Task):
        return made
    if isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        return Task(*made)
    raise ConfigError(f"--task {target!r} returned {type(made).__name__}; return "
                      "torchjob.trainer.tasks.Task(model, train, eval) or a (model, train, "
                      "eval) tuple")

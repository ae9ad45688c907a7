"""The gpt task's corpus, tokenizer and split (trainer.gpt): deterministic, the same for every
rank and seed, the held-out text disjoint from the training text."""

from __future__ import annotations

import dataclasses
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

from tests.procs import PYTHON, env_for_tests
from torchjob.trainer import gpt
from torchjob.trainer.config import ConfigError, TrainConfig, parse_args
from torchjob.trainer.data import TrainBatches
from torchjob.trainer.fingerprint import differences
from torchjob.trainer.objectives import NextToken
from torchjob.trainer.tasks import build_task


def test_corpus_is_the_listed_modules_and_stable() -> None:
    a, b = gpt.stdlib_corpus(), gpt.stdlib_corpus()
    assert a == b  # same bytes, same identity, every time it is read
    root = Path(sysconfig.get_paths()["stdlib"])
    assert a.train.startswith((root / f"{gpt.TRAIN_MODULES[0]}.py").read_bytes())
    assert 2_000_000 < len(a.train) < 5_000_000 and 40_000 < len(a.eval) < 200_000
    assert a.identity.startswith("python-stdlib ") and "sha256:" in a.identity


def test_held_out_files_are_not_trained_on() -> None:
    assert not set(gpt.TRAIN_MODULES) & set(gpt.EVAL_MODULES)
    corpus = gpt.stdlib_corpus()
    for name in gpt.EVAL_MODULES:
        text = (Path(sysconfig.get_paths()["stdlib"]) / f"{name}.py").read_bytes()
        assert text in corpus.eval and text[:2000] not in corpus.train


def test_windows_are_bytes_shifted_by_one() -> None:
    data = gpt.windows(b"abcdefghij", context=3)
    x, y = data.tensors
    assert x.tolist() == [list(b"abc"), list(b"def"), list(b"ghi")]
    assert y.tolist() == [list(b"bcd"), list(b"efg"), list(b"hij")]
    assert x.dtype == torch.long
    with pytest.raises(ConfigError, match="--gpt-context 10 is longer than the text"):
        gpt.windows(b"short", context=10)


def test_the_split_ignores_the_seed_and_ranks_share_one_epoch() -> None:
    tasks = [build_task(TrainConfig(task="gpt", gpt_context=64, seed=seed)) for seed in (0, 7)]
    for a, b in zip(tasks[0].train.tensors, tasks[1].train.tensors):  # type: ignore[attr-defined]
        assert torch.equal(a, b)
    assert torch.equal(tasks[0].eval.tensors[0], tasks[1].eval.tensors[0])  # type: ignore
    task = tasks[0]
    assert isinstance(task.objective, NextToken) and task.objective.tokens_per_sample == 64
    assert task.shard_units == list(task.model.blocks)  # type: ignore[arg-type]
    # two ranks' epoch: disjoint windows, together every window of the epoch's whole steps
    picked = []
    for rank in (0, 1):
        batches = TrainBatches(task.train, batch_size=32, grad_accum=1, world_size=2, rank=rank,
                               seed=0, num_workers=0)
        picked.append(set(batches.order(0, 0)))
        x, y = next(batches.epoch(0))
        assert x.shape == y.shape == (32, 64) and torch.equal(x[:, 1:], y[:, :-1])
    assert not picked[0] & picked[1]
    n = len(task.train)  # type: ignore[arg-type]
    assert len(picked[0] | picked[1]) == n - n % 64  # the tail short of one step is left out


def test_unigram_entropy() -> None:
    assert gpt.unigram_entropy(b"aaaa") == 0.0
    assert gpt.unigram_entropy(bytes(range(256))) == pytest.approx(torch.log(torch.tensor(256.)))


def test_model_size_and_shapes() -> None:
    model = gpt.GPT(layers=4, heads=4, width=256, context=128)
    assert 3_000_000 < sum(p.numel() for p in model.parameters()) < 4_000_000
    assert model(torch.zeros(2, 16, dtype=torch.long)).shape == (2, 16, gpt.VOCAB)


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ConfigError, match="--gpt-heads 3 must divide --gpt-width 256"):
        parse_args(["--task", "gpt", "--gpt-heads", "3"])


def test_a_corpus_of_another_python_is_a_difference() -> None:
    """The checkpoint keeps the corpus identity as ``data``; a launcher's config has none."""
    cfg = dataclasses.asdict(TrainConfig(task="gpt"))
    old = {**cfg, "data": "python-stdlib 3.11.2 sha256:aaaa"}
    new = {**cfg, "data": "python-stdlib 3.12.1 sha256:bbbb"}
    assert differences(old, new) == [("data", old["data"], new["data"])]
    assert differences(old, cfg) == []


SAME_DATA = """
import os, sys, types
import torch.distributed as dist
from torchjob.trainer.config import ConfigError
from torchjob.trainer.train import same_data
dist.init_process_group("gloo")
rank = dist.get_rank()
for name, identity in (("same", "python-stdlib 3.11.7 sha256:a"),
                       ("odd", f"python-stdlib 3.11.{rank} sha256:a")):
    try:
        same_data(identity, types.SimpleNamespace(rank=rank))
        line = f"{name} {rank} agreed"
    except ConfigError as exc:
        line = f"{name} {rank} refused: {exc}"
    os.write(1, (line + "\\n").encode())  # one write: the two ranks share the pipe
dist.destroy_process_group()
"""


def test_ranks_that_read_different_text_are_refused(tmp_path: Path) -> None:
    """Every rank stops with exit 2's error when one node's Python has other sources."""
    (tmp_path / "same_data.py").write_text(SAME_DATA)
    proc = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(tmp_path / "same_data.py")],
                          env=env_for_tests(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert {"same 0 agreed", "same 1 agreed"} <= set(lines), proc.stdout
    assert ("odd 0 refused: the ranks read different data: rank 0 has 'python-stdlib 3.11.0 "
            "sha256:a' but rank 1 on ") in proc.stdout
    assert "odd 1 refused: the ranks read different data: rank 1 has" in proc.stdout

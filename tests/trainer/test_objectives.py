"""The objectives (trainer.objectives): a batch's loss, and evaluation sums that add up across
batches and ranks to the metrics of the whole set, repeated samples (weight 0) left out."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from torchjob.trainer.objectives import CLASSIFY, NextToken


def test_classify_is_cross_entropy_and_accuracy() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    labels = torch.tensor([0, 0, 0])
    assert torch.equal(CLASSIFY.loss(logits, labels), F.cross_entropy(logits, labels))
    sums = CLASSIFY.eval_sums(logits, labels, torch.tensor([1.0, 1.0, 0.0]))
    scores = CLASSIFY.scores(sums.tolist())
    assert scores["accuracy"] == 0.5
    assert scores["loss"] == pytest.approx(F.cross_entropy(logits[:2], labels[:2]).item())
    assert CLASSIFY.rates(10.0) == {}


def test_next_token_counts_tokens_and_reports_perplexity() -> None:
    torch.manual_seed(0)
    logits, targets = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))
    mean = F.cross_entropy(logits.reshape(15, 7), targets.reshape(15))
    objective = NextToken(tokens_per_sample=5)
    assert objective.loss(logits, targets).item() == pytest.approx(mean.item())
    # two batches, the second with a repeated sample of weight 0: the sums add up
    first = objective.eval_sums(logits[:2], targets[:2], torch.ones(2))
    second = objective.eval_sums(logits[2:].repeat(2, 1, 1), targets[2:].repeat(2, 1),
                                 torch.tensor([1.0, 0.0]))
    scores = objective.scores((first + second).tolist())
    assert scores["loss"] == pytest.approx(mean.item())
    assert scores["perplexity"] == pytest.approx(math.exp(mean.item()))
    assert objective.metrics == ("loss", "perplexity")
    assert objective.rates(2.0) == {"tokens_per_s": 10.0}

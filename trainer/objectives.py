"""What a task's loss is and how it is scored: one object per kind, chosen by the task
(``Task.objective``), so that no part of the loop knows which task it trains.
:data:`CLASSIFY`: cross-entropy over classes (loss, accuracy); :class:`NextToken`: a language
model's (loss in nats per token, perplexity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Classify:
    """Logits (batch, classes) against labels (batch,)."""

    metrics: tuple[str, ...] = ("loss", "accuracy")  # what evaluation reports, in this order

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    def eval_sums(self, out: torch.Tensor, target: torch.Tensor,
                  weight: torch.Tensor) -> torch.Tensor:
        """(loss sum, correct, samples) of a batch, each sample weighted (0: a repeat)."""
        losses = F.cross_entropy(out, target, reduction="none")
        return torch.stack([(losses * weight).sum(), ((out.argmax(1) == target) * weight).sum(),
                            weight.sum()]).double()

    def scores(self, sums: list[float]) -> dict[str, float]:
        loss, correct, count = sums
        return {"loss": loss / count, "accuracy": correct / count}

    def rates(self, samples_per_s: float) -> dict[str, float]:
        """Throughput figures besides samples/s: none for a classifier."""
        return {}


@dataclass(frozen=True)
class NextToken:
    """Logits (batch, time, vocabulary) against the next tokens (batch, time)."""

    tokens_per_sample: int
    metrics: tuple[str, ...] = ("loss", "perplexity")

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, -2), target.flatten())

    def eval_sums(self, out: torch.Tensor, target: torch.Tensor,
                  weight: torch.Tensor) -> torch.Tensor:
        """(loss sum over tokens, tokens) of a batch, each sample weighted (0: a repeat)."""
        losses = F.cross_entropy(out.flatten(0, -2), target.flatten(), reduction="none")
        per_sample = losses.view(target.shape[0], -1).sum(1)
        tokens = weight.sum() * (target.numel() // max(target.shape[0], 1))
        return torch.stack([(per_sample * weight).sum(), tokens]).double()

    def scores(self, sums: list[float]) -> dict[str, float]:
        loss, tokens = sums
        mean = loss / tokens
        return {"loss": mean, "perplexity": math.exp(min(mean, 700.0))}

    def rates(self, samples_per_s: float) -> dict[str, float]:
        return {"tokens_per_s": round(samples_per_s * self.tokens_per_sample, 1)}


Objective = Classify | NextToken
CLASSIFY = Classify()

"""Gradient clipping on DDP's flat buckets (trainer.parallel.clip_gradients) scales every gradient
to the bit as ``nn.utils.clip_grad_norm_`` scales each parameter's, and falls back to it when the
buckets do not hold the gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchjob.trainer.preempt import StopRequest
from torchjob.trainer.parallel import clip_gradients


def grads_after(model: nn.Module, reference: nn.Module, max_norm: float,
                buckets: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    for _ in range(2):  # DDP rebuilds its buckets after the first backward
        x = torch.randn(32, 8)
        for net in (model, reference):
            net.zero_grad(set_to_none=True)
            (net(x).pow(2).sum() * 100).backward()
    clip_gradients(model, max_norm, buckets)
    nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    return ([p.grad for p in model.parameters()],  # type: ignore[misc]
            [p.grad for p in reference.parameters()])  # type: ignore[misc]


@pytest.mark.parametrize("max_norm", [0.5, 1e9])  # clipped, and left alone
def test_clipping_the_buckets_equals_clipping_each_gradient(one_rank: None,
                                                            max_norm: float) -> None:
    torch.manual_seed(0)
    # over DDP's first bucket (1 MB), so that there are several
    net = nn.Sequential(nn.Linear(8, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                        nn.Linear(512, 4))
    reference = copy.deepcopy(net)
    model = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=True,
                                                bucket_cap_mb=0.01)  # several buckets
    stop = StopRequest(0)
    try:
        stop.ride(model, torch.device("cpu"))
        ours, theirs = grads_after(model, reference, max_norm, stop.buckets)
        assert len(stop.buckets) > 1
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b)  # to the bit: the same norm, the same scale
        if max_norm < 1:
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in ours]))
            assert norm == pytest.approx(max_norm, rel=1e-4)
    finally:
        stop.restore()


def test_buckets_that_do_not_hold_the_gradients_are_not_clipped_instead(one_rank: None) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    reference = copy.deepcopy(net)
    stray = [torch.ones(16 * 8 + 16 + 4 * 16 + 4)]  # as many elements, but not the gradients
    ours, theirs = grads_after(net, reference, 0.5, stray)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    assert torch.equal(stray[0], torch.ones_like(stray[0]))

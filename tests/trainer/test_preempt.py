"""The stop vote (trainer.preempt): every rank reads each vote one step after the step that
cast it, never waiting for the device's queued work (on a GPU, from pinned memory behind an
event; here on CPU, the same steps)."""

from __future__ import annotations

import signal
from collections.abc import Callable

import torch
from torch import nn

from torchjob.trainer.preempt import StopRequest


def votes(stop: StopRequest, steps: int, signal_before: int,
          step: Callable[[], None] | None = None) -> list[bool]:
    """``agreed()`` at each of ``steps`` steps, a SIGTERM arriving before step
    ``signal_before`` (1-based); ``step()``, when given, is the step's own work."""
    said = []
    for n in range(1, steps + 1):
        if n == signal_before:
            stop._handle(signal.SIGTERM, None)
        if step is not None:
            step()
        said.append(stop.agreed())
    return said


def test_a_vote_of_its_own_is_read_two_steps_after_the_signal(one_rank: None) -> None:
    """Without DDP (FSDP2, world size 1): the vote a step casts runs in the background of the
    next and is read at the one after."""
    stop = StopRequest(0)
    try:
        assert votes(stop, 5, signal_before=2) == [False, False, False, True, True]
    finally:
        stop.settle()
        stop.restore()


def test_a_ballot_in_the_gradients_is_read_at_the_next_step(one_rank: None) -> None:
    """Under DDP the ballot rides in the step's gradient all-reduce and is read a step later."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2), gradient_as_bucket_view=True)
    stop = StopRequest(0)
    try:
        stop.ride(model, torch.device("cpu"))

        def backward() -> None:
            model.zero_grad(set_to_none=True)
            model(torch.randn(3, 4)).sum().backward()
        assert votes(stop, 4, signal_before=2, step=backward) == [False, False, True, True]
    finally:
        stop.restore()


def test_no_process_group_no_vote() -> None:
    stop = StopRequest(0)
    try:
        assert votes(stop, 3, signal_before=2) == [False, True, True]
    finally:
        stop.restore()

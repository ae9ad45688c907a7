"""Stop signals: SIGTERM, SIGUSR1 and SIGUSR2 ask the trainer to finish its step, checkpoint and
exit 143 (Slurm's --signal, Kubernetes' pod deletion and torchrun all send one of them).

Every rank votes once per optimizer step, so all stop after the same step: under DDP the
ballot rides in the gradient all-reduce (``ride``), else it is a one-element all-reduce in the
background of the next step; either is read one step late, without waiting for the device's
queued work (docs/internals.md).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types

import torch
import torch.distributed as dist

from torchjob.trainer.contract import EXIT_STOPPED
from torchjob.trainer.contract import STOP_SIGNALS
# A second signal this soon after the first is the same stop delivered twice: to the whole
# process group (TorchX's local scheduler, scancel of a step) and forwarded by the agent.
SAME_STOP_S = 1.0


class StopRequest:
    """Remembers the first stop signal; a second one (after ``SAME_STOP_S``), or the grace
    period running out, ends the process at once with 143 (the last periodic checkpoint is
    then where the next run starts)."""

    def __init__(self, grace_s: float) -> None:
        self.signum: int | None = None
        self._first = 0.0  # when it came (time.monotonic)
        self.grace_s = grace_s
        self._vote: dist.Work | None = None
        self._timer: threading.Timer | None = None
        self._device = torch.device("cpu")
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._riding = False  # the ballot rides in DDP's gradient all-reduce (``ride``)
        self._ballot: torch.Tensor | None = None  # its result: the step's sum of flags
        # the last step's result, read at this step (``_late``): its copy to the host and,
        # on a GPU, the event after it, so that reading it never waits for this step's work
        self._host: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None
        self._pending = False
        # DDP's gradient buckets reduced this step (every gradient is a view into one of them,
        # gradient_as_bucket_view): what the trainer scales to clip (trainer.parallel.clip_gradients)
        self.buckets: list[torch.Tensor] = []
        self.ballot_bucket = 0  # the smallest of the last step's (every rank's layout is one)
        self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        if self.signum is not None:
            if time.monotonic() - self._first < SAME_STOP_S:
                return  # the same stop, delivered twice
            sys.stderr.write(f"second {signal.Signals(signum).name}: exiting now\n")
            os._exit(EXIT_STOPPED)
        self.signum, self._first = signum, time.monotonic()
        if self.grace_s > 0:
            self._timer = threading.Timer(self.grace_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        sys.stderr.write(f"stop grace of {self.grace_s:.0f}s ran out before a checkpoint was "
                         "written: exiting; the run resumes from the last periodic checkpoint\n")
        sys.stderr.flush()
        os._exit(EXIT_STOPPED)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a peer's stop signal"

    def ride(self, model: torch.nn.Module, device: torch.device) -> None:
        """Vote on ``device``; under DDP, in the gradient all-reduce of each optimizer step."""
        self._device = device
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model.register_comm_hook(self, _allreduce_with_ballot)
            self._riding = True

    def cast(self, bucket: torch.Tensor) -> torch.Tensor:
        """``bucket`` with this rank's ballot after it (1.0: stop), to be summed."""
        flag = 1.0 if self.signum is not None else 0.0
        return torch.cat([bucket, bucket.new_full((1,), flag)])

    def new_step(self) -> None:
        """DDP reduces a step's first bucket: the ballot goes in the smallest of the last
        step's (the same index on every rank; none this step if the layout shrank, after DDP
        rebuilt its buckets once: the stop then waits a step)."""
        if self.buckets:
            self.ballot_bucket = min(range(len(self.buckets)),
                                      key=lambda i: self.buckets[i].numel())
        self.buckets.clear()

    def counted(self, summed: torch.Tensor) -> None:
        self._ballot = summed[-1:]

    def agreed(self) -> bool:
        """Call once per optimizer step on every rank: True when any rank was told to stop.
        Under DDP it reads this step's ballot; else it collects the vote started at the
        previous step and starts the next.
        """
        if not dist.is_initialized():
            return self.signum is not None
        if self._riding:
            ballot, self._ballot = self._ballot, None
            return self._late(ballot) > 0
        stop = False
        if self._vote is not None:
            self._vote.wait()  # on a GPU: the stream waits, not this thread
            stop = self._late(self._flag) > 0
        # made on the device (torch.tensor(..., device=) would copy from the host, and
        # wait for the stream)
        self._flag = torch.full((1,), 1 if self.signum is not None else 0, dtype=torch.int32,
                                device=self._device)
        self._vote = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, async_op=True)
        return stop

    def _late(self, result: torch.Tensor | None) -> float:
        """The vote's ``result`` (one element) as it was one call ago: this call's is only
        copied to the host. On a GPU, reading a device tensor (``.item()``) would wait for
        all the work queued so far, this whole step, and the GPU would idle while this thread
        prepares the next step; the copy's event waits only for the last step's vote. Every
        rank reads the same vote at the same step (0 the first time, or after a step with
        none)."""
        said = 0.0
        if self._pending and self._host is not None:
            if self._copied is not None:
                self._copied.synchronize()
            said = float(self._host.item())
        self._pending = result is not None
        if result is None:
            return said
        if not result.is_cuda:
            self._host = result.detach().clone()
            return said
        if self._host is None or self._host.dtype != result.dtype:
            self._host = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
            self._copied = torch.cuda.Event()
        self._host.copy_(result, non_blocking=True)
        assert self._copied is not None
        self._copied.record()
        return said

    def settle(self) -> None:
        """Finish the outstanding vote so no collective is left in flight (before teardown)."""
        if self._vote is not None:
            self._vote.wait()
            self._vote = None

    def restore(self) -> None:
        """Done (stopped, or the work ended first): no grace period runs any more, and the
        handlers from before are back."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def _allreduce_with_ballot(stop: StopRequest,
                           bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce of a gradient bucket (divide by the world size, then sum, as
    ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook``); the smallest
    bucket of the last step (every rank has the same layout) carries every rank's stop ballot
    too, at the cost of copying it twice."""
    buffer = bucket.buffer()
    if bucket.index() == 0:  # a new step (buckets are reduced in order)
        stop.new_step()
    stop.buckets.append(buffer)
    buffer.div_(dist.get_world_size())
    if bucket.index() != stop.ballot_bucket:
        work = dist.all_reduce(buffer, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
    packed = stop.cast(buffer)
    work = dist.all_reduce(packed, async_op=True)

    def unpack(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        summed = fut.value()[0]
        stop.counted(summed)
        buffer.copy_(summed[:-1])
        return buffer
    return work.get_future().then(unpack)


# DDP checks a hook's annotations by identity; under ``from __future__ import annotations``
# they are strings, so the real ones are put back here.
_allreduce_with_ballot.__annotations__.update(bucket=dist.GradBucket,
                                              **{"return": torch.futures.Future[torch.Tensor]})


def ignore_stop_signals() -> None:
    """The work is done and the exit code settled: stop signals are ignored from here to the
    process's end, so that a late one (Slurm's early time-limit USR2) neither requeues nor
    kills a finished task (docs/internals.md)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)

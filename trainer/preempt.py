"""Stop signals: SIGTERM, SIGUSR1 and SIGUSR2 ask the trainer to finish its step, checkpoint and
exit 143 (Slurm's --signal, Kubernetes' pod deletion and torchrun all send one of them).

Ranks may receive the signal at slightly different moments, so the decision to stop is agreed
with a one-element all-reduce that runs in the background of the next step: every rank stops
after the same step.
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

from trainer.contract import EXIT_STOPPED as EXIT_PREEMPTED
from trainer.contract import STOP_SIGNALS
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
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        if self.signum is not None:
            if time.monotonic() - self._first < SAME_STOP_S:
                return  # the same stop, delivered twice
            sys.stderr.write(f"second {signal.Signals(signum).name}: exiting now\n")
            os._exit(EXIT_PREEMPTED)
        self.signum, self._first = signum, time.monotonic()
        if self.grace_s > 0:
            self._timer = threading.Timer(self.grace_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        sys.stderr.write(f"stop grace of {self.grace_s:.0f}s ran out before a checkpoint was "
                         "written: exiting; the run resumes from the last periodic checkpoint\n")
        sys.stderr.flush()
        os._exit(EXIT_PREEMPTED)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a peer's stop signal"

    def agreed(self) -> bool:
        """Call once per optimizer step on every rank: True when any rank was told to stop.

        Collects the vote started at the previous step and starts the next one, so the
        all-reduce overlaps with a whole step of work instead of stalling it.
        """
        if not dist.is_initialized():
            return self.signum is not None
        stop = False
        if self._vote is not None:
            self._vote.wait()
            stop = bool(self._flag.item())
        self._flag = torch.tensor([1 if self.signum is not None else 0], dtype=torch.int32)
        self._vote = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, async_op=True)
        return stop

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


def ignore_stop_signals() -> None:
    """The work is done and the process's exit code settled: a stop signal from here to the
    process's end has nothing left to stop, so it is ignored.

    Slurm sends its time-limit USR2 up to ~40 s early, so it can land while a finished task
    exits. Handled by submitit's handler (which the trainer puts back), it would requeue the
    finished job; in the interpreter's finalization, which puts the default action back, it
    kills the task, and Slurm counts the whole job FAILED. Harmless under torchrun, whose
    agent is done only once every worker process has exited; not for the workers that
    trainer.agent forks, whose agent stops a finished worker with SIGTERM while it waits for
    its result to be read (trainer.agent.worker)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)

"""The trainer's throughput clock: samples per second in steady state.

On a GPU the loop runs ahead of the device; ``sync`` (``torch.cuda.synchronize``) makes the
two readings a rate is taken between, the warm-up's end and an ``exact`` tick, the device's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Throughput:
    """Samples per second between the end of a short warm-up and the latest step (start-up,
    evaluation and the final checkpoint are not steady state)."""

    def __init__(self, warmup_steps: int, sync: Callable[[], object] | None = None) -> None:
        self.warmup, self.steps, self.samples, self.sync = warmup_steps, 0, 0, sync
        self.t0 = self.started = self.last = time.perf_counter()
        self.warm = self.t0  # when the warm-up ended: the ETA's pace counts from here
        self.off = 0.0  # seconds off the clock since the last step

    def tick(self, samples: int, exact: bool = False) -> None:
        """A step is done; ``exact``: its rate is read now (a log line, the last step), so
        the device finishes its queued work before the clock is read (the warm-up's end too)."""
        self.steps += 1
        if self.sync is not None and (exact or self.steps == self.warmup):
            self.sync()
        self.last = time.perf_counter()
        if self.steps == self.warmup:
            self.t0, self.warm, self.samples = self.last, self.last, 0
        elif self.steps > self.warmup:
            self.samples += samples
            self.t0 += self.off
        self.off = 0.0

    def outside(self, work: Callable[[], T]) -> T:
        """Do ``work`` (an evaluation) off the clock: it is not training throughput."""
        began = time.perf_counter()
        try:
            return work()
        finally:
            self.off += time.perf_counter() - began

    def rate(self) -> float:
        elapsed = self.last - self.t0
        return self.samples / elapsed if elapsed > 0 and self.samples else 0.0

    def eta(self, steps_left: int) -> float | None:
        """Seconds until ``steps_left`` more steps are done at the wall-clock pace since the
        warm-up (evaluations and checkpoints included, as they will come again); None before
        a step past the warm-up."""
        done = self.steps - self.warmup
        if done <= 0 or self.last <= self.warm:
            return None
        return max(0, steps_left) * (self.last - self.warm) / done

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

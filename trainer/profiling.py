"""``--profile A:B``: torch.profiler over optimizer steps A to B of a run, for "why is a step
slow": the host's operators and, on a GPU, the device's kernels, with each step marked. Every
rank writes a Chrome trace, ``RUN_DIR/profile/rank{R}.json`` (open it in Perfetto or
chrome://tracing: a gap between kernels on the GPU's row is the device waiting for the host),
and rank 0 logs its busiest operators. The steps are counted from the run's start (a resumed
run's first step is the checkpoint's plus one); a run that ends or stops sooner writes what
it has."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

TOP_OPERATORS = 15  # rows of the table rank 0 logs


class StepProfiler:
    """Profiles steps ``first`` to ``last`` of a run that goes from ``start_step`` to
    ``end_step`` (``after(step)`` is called once each optimizer step is done, ``close()`` once
    the loop ends), each step a region of its own in the trace (``ProfilerStep#N``, as
    torch.profiler's schedules name them)."""

    def __init__(self, steps: tuple[int, int], run_dir: str, rank: int, device: torch.device,
                 say: Callable[[str], None], start_step: int = 0,
                 end_step: int | None = None) -> None:
        self.first, self.last = steps[0], min(steps[1], end_step or steps[1])
        self.path = os.path.join(run_dir, "profile", f"rank{rank}.json")
        self.rank, self.cuda, self.say = rank, device.type == "cuda", say
        self.profiler: Any = None
        self.region: Any = None  # the step being profiled
        self.done = start_step >= self.last or self.first > self.last
        if not self.done and start_step >= self.first - 1:
            self._start(start_step + 1)

    def _start(self, step: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.start()
        self._enter(step)

    def _enter(self, step: int) -> None:
        self.region = torch.profiler.record_function(f"ProfilerStep#{step}")
        self.region.__enter__()

    def _leave(self) -> None:
        region, self.region = self.region, None
        if region is not None:
            region.__exit__(None, None, None)

    def after(self, step: int) -> None:
        if self.done:
            return
        if self.profiler is None:
            if step == self.first - 1:
                self._start(step + 1)
            return
        self._leave()
        if step >= self.last:
            self.close()
        else:
            self._enter(step + 1)

    def close(self) -> None:
        """Stop, write the trace, log the table (rank 0); nothing when nothing was profiled."""
        self._leave()
        profiler, self.profiler, self.done = self.profiler, None, True
        if profiler is None:
            return
        profiler.stop()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        profiler.export_chrome_trace(self.path)
        if self.rank == 0:
            key = "self_device_time_total" if self.cuda else "self_cpu_time_total"
            table = profiler.key_averages().table(sort_by=key, row_limit=TOP_OPERATORS)
            self.say(f"profile of steps {self.first}-{self.last} (slower under the profiler, "
                     f"and counted in samples/s): a trace per rank in "
                     f"{os.path.dirname(self.path)} (open it in https://ui.perfetto.dev); the "
                     f"busiest operators of rank 0:\n{table}")

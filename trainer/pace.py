"""The job's progress as node 0's agent sees it, for ``torchjob status``: RUN_DIR/progress.json,
rewritten (whole, by a rename) every ``PACE_S`` while the workers run; a script's also said in
its log (``contract.COUNTED``, for status where it reads logs). What a script that writes no
metrics of its own shows: its slowest local rank's step (``progress.step``, else its optimizer
steps counted), the pace since this attempt's first step was seen, the total when the script
told it (``progress.step(n, total=T)``), the attempt, and the time."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchjob.trainer.contract import counted_line
from torchjob.trainer.dirs import write_whole
from torchjob.trainer.hang import Seen
from torchjob.trainer.progress import NO_STEP

PROGRESS_FILE = "progress.json"
PACE_S = 5.0  # how often the file is rewritten: status is read by people, not machines
SAY_S = 30.0  # how often the count is said in the log, when it moved: a line a minute or two


def step_of(worker: Seen) -> int | None:
    """The step ``worker`` reached: its own count, else the optimizer steps seen; None before
    either."""
    record = worker.record
    if record is None:
        return None
    if record.step != NO_STEP:
        return record.step
    return record.optimizer_steps or None


class Pace:
    """What node 0's agent last wrote, and where this attempt's count began."""

    def __init__(self, run_dir: str | os.PathLike[str] | None,
                 say: Callable[[str], None] | None = None) -> None:
        """``run_dir`` None: no file (the log only); ``say``: the agent's log (None: none)."""
        self.file = Path(run_dir) / PROGRESS_FILE if run_dir else None
        self.say = say
        self.attempt = -1
        self.first: tuple[float, int] | None = None  # (monotonic time, step) of this attempt
        self.written = float("-inf")
        self.said: tuple[float, int] = (float("-inf"), -1)  # when it last said, which step

    def tell(self, workers: Sequence[Seen], attempt: int, now: float, *,
             last: bool = False) -> dict[str, Any] | None:
        """Rewrite the file when ``PACE_S`` has passed (``now``: monotonic), or ``last`` (the
        workers have ended), and say the count when ``SAY_S`` has passed, or ``last``, and it
        moved; what was told, or None. A file that cannot be written is left: status shows
        less."""
        if attempt != self.attempt:
            self.attempt, self.first = attempt, None
        if now - self.written < PACE_S and not last:  # every monitor tick: nothing else
            return None
        steps = [s for s in map(step_of, workers) if s is not None]
        if not steps:
            return None
        step = min(steps)
        if self.first is None:
            self.first = (now, step)
        since, first = self.first
        totals = [w.record.total for w in workers if w.record is not None and w.record.total > 0]
        data: dict[str, Any] = {
            "time": round(time.time(), 3), "step": step, "attempt": attempt,
            "total_steps": max(totals) if totals else None,
            "steps_per_s": round((step - first) / (now - since), 4)
            if step > first and now > since else None}
        self.written = now
        if self.say is not None and (last or now - self.said[0] >= SAY_S) \
                and step != self.said[1]:
            self.said = (now, step)
            self.say(counted_line(step, data["total_steps"], data["steps_per_s"]))
        if self.file is None:
            return data
        try:
            write_whole(self.file, json.dumps(data) + "\n",
                        self.file.with_name(f".{PROGRESS_FILE}.{os.getpid()}"))
        except OSError:
            return None
        return data

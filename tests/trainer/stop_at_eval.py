"""A user task (``--task tests.trainer.stop_at_eval:task``) that sends SIGTERM to the process
``$STOP_PID`` when the evaluation after the last step starts: a stop signal that lands after
the last step's stop check, while the final evaluation and checkpoint are under way. Only the
first rank to get there sends it (a marker file in ``$STOP_MARKER`` decides)."""

from __future__ import annotations

import os
import signal
from typing import Any

from torch.utils.data import Dataset

from torchjob.trainer.tasks import Task, digits_task


class SignalOnFirstItem(Dataset[Any]):
    def __init__(self, inner: Dataset[Any]) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        try:
            fd = os.open(os.environ["STOP_MARKER"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            os.kill(int(os.environ["STOP_PID"]), signal.SIGTERM)
        return self.inner[index]


def task() -> Task:
    digits = digits_task()
    return Task(digits.model, digits.train, SignalOnFirstItem(digits.eval))

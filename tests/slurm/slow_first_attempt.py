"""``--task tests.slurm.slow_first_attempt:digits``: the built-in digits task whose training
steps each sleep ``STEP_S`` more in a job's first attempt (``TORCHJOB_ATTEMPT_BASE`` and torch's
restart count both 0), so that a time limit stops it after few steps on any machine, asleep
rather than busy; the next attempt trains at full speed. The sleep changes no parameter."""

from __future__ import annotations

import os
import time
from typing import Any

from torch import nn

from torchjob.trainer.contract import ATTEMPT_BASE_ENV
from torchjob.trainer.tasks import Task, digits_task

STEP_S = 0.2


def digits() -> Task:
    task = digits_task()
    first = os.environ.get(ATTEMPT_BASE_ENV, "0") == "0" and \
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    def asleep(module: nn.Module, args: Any) -> None:
        if module.training:
            time.sleep(STEP_S)

    if first:
        task.model.register_forward_pre_hook(asleep)
    return task

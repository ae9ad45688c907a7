"""A user task (``--task slow_alone:task``, this folder on PYTHONPATH) for the elastic
container test: the synthetic problem (32000 samples of 32 features, an MLP of 2 hidden
layers of 64) whose steps sleep ``$SLOW_ALONE_STEP_S`` seconds while the world is smaller
than ``$SLOW_ALONE_BELOW``.

A node stopped and started again must rejoin while work is left. At full speed the group
left alone can finish the job before the restarted node's agent has even imported torch,
the more so as its busy workers take the CPUs that start-up needs. Sleeping while alone
leaves the CPUs idle and the work unfinished until the node is back; once it is, the steps
run at full speed. A forward pre-hook sleeps, so the model's parameters and checkpoints are
those of the synthetic task."""

from __future__ import annotations

import os
import time
from typing import Any

from torch import nn

from torchjob.trainer.config import TrainConfig
from torchjob.trainer.tasks import Task, synthetic_task


def task() -> Task:
    made = synthetic_task(TrainConfig(synthetic_samples=32000, synthetic_dim=32,
                                      synthetic_hidden=64, synthetic_layers=2))
    if int(os.environ["WORLD_SIZE"]) < int(os.environ.get("SLOW_ALONE_BELOW", "0")):
        pause = float(os.environ.get("SLOW_ALONE_STEP_S", "0.03"))

        def sleep(module: nn.Module, inputs: Any) -> None:
            if module.training:
                time.sleep(pause)
        made.model.register_forward_pre_hook(sleep)
    return made

"""The conformance cells' task: the built-in digits task with a gate in its model's forward
pass, so that a cell acts at a known step of a run on any backend without sleeping.

Set through the job's ``env`` (every backend passes it to every worker):
``CONFORMANCE_GATE=DIR``: at training step ``GATE_STEP`` each rank writes ``DIR/at-RANK``
(its pid and host name: a worker in a container has its pid there, its host name is the
container's) and holds until ``DIR/go`` exists or the trainer was told to stop (then it writes
``DIR/stopping-RANK`` and goes on, so that the stop lands in that step); once ``go`` exists
the gate stays open, for the restarted and resumed runs too.
``CONFORMANCE_RAISE_RANK=R``: rank R raises a ValueError at that step, as user code would.
The hook changes no parameter, so a gated run ends bitwise where an ungated one ends.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from torch import nn

from torchjob.trainer.tasks import Task, digits_task

GATE_ENV = "CONFORMANCE_GATE"
RAISE_ENV = "CONFORMANCE_RAISE_RANK"
GATE_STEP = 6  # of the cells' 10 steps: after the checkpoint at step 4
HOLD_S = 300.0  # a gate nobody opens fails the run rather than holding it forever


def digits() -> Task:
    """``--task tests.conformance.gate:digits``."""
    task = digits_task()
    calls = [0]

    def before_forward(module: nn.Module, args: Any) -> None:
        if module.training:
            calls[0] += 1
            if calls[0] == GATE_STEP:
                at_gate(os.environ.get("RANK", "0"))

    task.model.register_forward_pre_hook(before_forward)
    return task


def at_gate(rank: str) -> None:
    if os.environ.get(RAISE_ENV) == rank:
        raise ValueError(f"conformance: rank {rank} raises at step {GATE_STEP}")
    folder = os.environ.get(GATE_ENV)
    if not folder or (Path(folder) / "go").exists():
        return
    gate = Path(folder)
    gate.mkdir(parents=True, exist_ok=True)
    write(gate / f"at-{rank}", f"{os.getpid()} {socket.gethostname()}")
    deadline = time.monotonic() + HOLD_S
    while not (gate / "go").exists():
        if stop_requested():
            write(gate / f"stopping-{rank}", str(os.getpid()))
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"conformance gate {gate}: nobody opened it in {HOLD_S:g} s")
        time.sleep(0.05)


def stop_requested() -> bool:
    """The trainer's stop handler (torchjob.trainer.preempt.StopRequest) has seen a stop signal."""
    handler = signal.getsignal(signal.SIGTERM)
    return getattr(getattr(handler, "__self__", None), "signum", None) is not None


def write(path: Path, text: str) -> None:
    """Whole or absent: a reader never sees half a pid."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)

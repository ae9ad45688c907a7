"""The process group: chosen backend, device from LOCAL_RANK, destroyed on every exit path."""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from torchjob.trainer.config import ConfigError
from torchjob.trainer.env import DistEnv


@dataclass(frozen=True)
class Group:
    """What the training loop needs to know about the world it runs in."""

    env: DistEnv
    device: torch.device
    backend: str

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size


def from_rank0(obj: Any) -> Any:
    """Rank 0's value of ``obj`` on every rank (``obj`` itself when there is no group)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def pick_backend(requested: str, env: DistEnv) -> tuple[str, torch.device]:
    """``auto`` is nccl with CUDA and gloo otherwise; the device index comes from LOCAL_RANK."""
    cuda = torch.cuda.is_available()
    backend = requested if requested != "auto" else ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError("--backend nccl needs CUDA, and no CUDA device is visible here; "
                          "use --backend gloo or auto")
    if cuda:
        count = torch.cuda.device_count()
        if env.local_rank >= count:
            raise ConfigError(f"LOCAL_RANK={env.local_rank} but only {count} CUDA device(s) "
                              "are visible: start at most one process per GPU "
                              f"(nproc_per_node <= GPUs per node, here {count}), or train on "
                              "the CPU with them hidden (CUDA_VISIBLE_DEVICES= in the "
                              "environment, e.g. CUDA_VISIBLE_DEVICES= torchjob run JOB.yaml)")
        return backend, torch.device("cuda", env.local_rank)
    return backend, torch.device("cpu")


@contextlib.contextmanager
def process_group(env: DistEnv, backend: str = "auto",
                  timeout_s: float = 300.0) -> Iterator[Group]:
    """Join the world described by ``env`` and leave it however the body exits."""
    name, device = pick_backend(backend, env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not env.is_distributed:
        yield Group(env, device, name)
        return
    os.environ.update(env.export())  # init_method env:// reads these, whoever launched us
    dist.init_process_group(backend=name, init_method="env://", rank=env.rank,
                            world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        yield Group(env, device, name)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()

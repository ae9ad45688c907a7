"""Run under torchrun (2 ranks, gloo) by test_parallel.py: the trainer's DDP wrapping, which does
not broadcast batch-norm statistics every forward, against DDP's default, which does, on the
same model, batches and optimizer. Rank 0 writes what both ranks saw as JSON to argv[1]."""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from torchjob.trainer.config import TrainConfig
from torchjob.trainer.dist import Group
from torchjob.trainer.parallel import same_statistics, wrap
from torchjob.trainer.tasks import build_task


def state(model: nn.Module) -> list[list[float]]:
    return [t.double().reshape(-1).tolist() for t in model.module.state_dict().values()]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    task = build_task(TrainConfig(task="digits"))  # the same initial weights on every rank
    reference = nn.parallel.DistributedDataParallel(copy.deepcopy(task.model),
                                                    gradient_as_bucket_view=True)
    group = Group(env=None, backend="gloo", device=torch.device("cpu"))  # type: ignore[arg-type]
    ours = wrap(task.model, TrainConfig(task="digits"), group)
    x, y = task.train.tensors  # type: ignore[attr-defined]
    nets = (ours, reference)
    opts = [torch.optim.SGD(net.parameters(), lr=0.1) for net in nets]
    torch.manual_seed(rank)  # each rank its own batches, and its own dropout draws
    for step in range(6):
        idx = torch.randint(0, len(y), (32,))
        seed = torch.seed()
        for net, opt in zip(nets, opts):
            torch.manual_seed(seed)  # the same dropout mask for both models
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
            opt.zero_grad()
    before = state(ours)
    same_statistics(ours)
    seen = {"broadcast_buffers": ours.broadcast_buffers, "ours": before,
            "ours_synced": state(ours), "reference": state(reference)}
    every: list[dict] = [{}, {}]
    dist.all_gather_object(every, seen)
    if rank == 0:
        with open(sys.argv[1], "w") as fh:
            json.dump(every, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

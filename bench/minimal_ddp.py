"""The baseline: a minimal hand-written DDP loop over the same synthetic model, data and batch
as ``python -m trainer --task synthetic``. Run under torchrun; prints samples/s from rank 0."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from trainer.config import TrainConfig
from trainer.tasks import synthetic_task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    task = synthetic_task(TrainConfig(task="synthetic"))
    model = DistributedDataParallel(task.model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    x_all, y_all = task.train.tensors  # type: ignore[attr-defined]
    sampler = DistributedSampler(task.train, num_replicas=world, rank=rank, seed=0)
    steps, samples, t0 = 0, 0, time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
            idx = order[start:start + args.batch_size]
            loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            if steps == args.warmup:
                t0, samples = time.perf_counter(), 0
            elif steps > args.warmup:
                samples += args.batch_size * world
    rate = samples / (time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"samples_per_s": rate, "steps": steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

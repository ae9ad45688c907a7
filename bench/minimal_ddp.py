"""The baseline: a minimal hand-written DDP loop doing what ``python -m torchjob.trainer`` does per
step, with nothing else. Run under torchrun; prints samples/s from rank 0.

Mirrored from trainer/train.py, setting by setting, so that the ratio measures the kit and not
a different recipe: the same task (model, data, split and init from ``torchjob.trainer.tasks``), the
same per-rank batch order (DistributedSampler, seed 0, full batches by index), DDP with
``gradient_as_bucket_view=True``, AdamW ``fused=True`` with the trainer's lr and weight decay,
gradient clipping at 1.0, the warm-up + cosine learning rate set every step, cross-entropy;
on CPU gloo and fp32, with ``--device cuda`` nccl, cuda:LOCAL_RANK, bf16 autocast (the
trainer's ``--precision auto`` on each) and DDP only with several processes, as the trainer.
Samples/s is counted as the trainer's ``Throughput`` counts it: from the end of step 5 to the end of the last step. What the
trainer adds and this loop leaves out is the kit's own cost: its progress file, its metrics
and log lines, its straggler timing, the agent around it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from torchjob.trainer.config import TrainConfig
from torchjob.trainer.tasks import build_task

WARMUP = 5  # steps before the clock starts, as torchjob.trainer.train.Throughput


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="digits")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--no-broadcast-buffers", action="store_true",
                    help="DDP(broadcast_buffers=False), as the trainer wraps this model")
    ap.add_argument("--eval", action="store_true",
                    help="rank 0 scores the test set after every epoch (a JSON line each)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    cfg = TrainConfig(task=args.task, batch_size=args.batch_size, epochs=args.epochs)
    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    task = build_task(cfg)
    model: torch.nn.Module = task.model.to(device)
    if world > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                        gradient_as_bucket_view=True,
                                        broadcast_buffers=not args.no_broadcast_buffers)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            fused=True)
    autocast: Any = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if cuda \
        else contextlib.nullcontext()
    x_all, y_all = task.train.tensors  # type: ignore[attr-defined]
    sampler: DistributedSampler[Any] = DistributedSampler(task.train, num_replicas=world,
                                                          rank=rank, seed=cfg.seed)
    per_epoch = sampler.num_samples // cfg.batch_size
    total = per_epoch * cfg.epochs
    torch.manual_seed(cfg.seed * 1000 + rank)
    model.train()
    step, samples, t0 = 0, 0, time.perf_counter()
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.long)
        for start in range(0, per_epoch * cfg.batch_size, cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            x, y = x_all[idx], y_all[idx]
            if cuda:  # pinned, without waiting: as the trainer (train.on_device)
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast:
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, step, total)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == WARMUP:
                if cuda:
                    torch.cuda.synchronize()
                t0, samples = time.perf_counter(), 0
            elif step > WARMUP:
                samples += cfg.batch_size * world
        if args.eval and rank == 0:
            print(json.dumps({"epoch": epoch, "accuracy": accuracy(task.model, task.eval),
                              "time": time.time()}), flush=True)
    if cuda:
        torch.cuda.synchronize()
    rate = samples / (time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"samples_per_s": rate, "steps": step, "max_memory_allocated":
                          torch.cuda.max_memory_allocated(device) if cuda else None}))
    dist.destroy_process_group()


@torch.no_grad()
def accuracy(net: torch.nn.Module, data: Any) -> float:
    net.eval()
    device = next(net.parameters()).device
    x, y = (t.to(device) for t in data.tensors)
    right = (net(x).argmax(1) == y).sum().item()
    net.train()
    return right / len(y)


def lr_at(cfg: TrainConfig, step: int, total: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

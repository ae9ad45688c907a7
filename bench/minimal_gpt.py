"""The baseline for ``--task gpt``: a minimal hand-written DDP loop with the trainer's model,
data, optimizer and precision (trainer.gpt's GPT and windows of the standard library's source;
fused AdamW; DDP with gradients in its buckets; fp32; gradient clipping at 1.0, as the trainer
by default). Run under torchrun; prints tokens/s from rank 0, measured after ``--warmup``
steps, as the trainer's summary measures them."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from trainer.gpt import GPT, stdlib_corpus, windows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = windows(stdlib_corpus().train, args.context)
    torch.manual_seed(0)
    model = DistributedDataParallel(GPT(layers=args.layers, heads=args.heads, width=args.width,
                                        context=args.context), gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4, fused=True)
    x_all, y_all = data.tensors
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
    order = torch.tensor(list(sampler))
    tokens, t0 = 0, time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = order[(step - 1) * args.batch_size:step * args.batch_size]
        logits = model(x_all[idx])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), y_all[idx].flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == args.warmup:
            t0, tokens = time.perf_counter(), 0
        elif step > args.warmup:
            tokens += args.batch_size * args.context * world
    rate = tokens / (time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"tokens_per_s": rate, "steps": args.steps, "loss": loss.item()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

"""The baseline for ``--task gpt``: a minimal hand-written DDP loop with the trainer's model,
data, optimizer and precision (trainer.gpt's GPT and windows of the standard library's source;
fused AdamW; DDP with gradients in its buckets; gradient clipping at 1.0, as the trainer by
default). On CPU: gloo and fp32. On CUDA: nccl, cuda:LOCAL_RANK, bf16 autocast (the trainer's
``--precision auto``), and DDP only with several processes, as the trainer wraps its model.
``--compile``: torch.compile of the model, as the trainer's ``--compile true``; ``--profile``:
steps under torch.profiler, as the trainer's ``--profile``. Run under
torchrun; prints tokens/s from rank 0, measured after ``--warmup`` steps, as the trainer's
summary measures them, with the parameter count and the peak memory (CUDA) in its JSON line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from torchjob.trainer.config import TrainConfig
from torchjob.trainer.gpt import GPT, stdlib_corpus, windows
from torchjob.trainer.profiling import StepProfiler


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
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--profile", default="", help="steps FIRST:LAST under torch.profiler, as "
                    "the trainer's --profile: a trace in --profile-dir/profile/")
    ap.add_argument("--profile-dir", default=".")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = windows(stdlib_corpus().train, args.context)
    torch.manual_seed(0)
    net = GPT(layers=args.layers, heads=args.heads, width=args.width, context=args.context)
    params = sum(p.numel() for p in net.parameters())
    model: nn.Module = net.to(device)
    if args.compile:  # in place, before DDP, as the trainer's --compile true
        model.compile()
    if world > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                        gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4, fused=True)
    autocast: Any = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if cuda \
        else contextlib.nullcontext()
    x_all, y_all = data.tensors
    sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=world, rank=rank,
                                                          seed=0)
    order = torch.tensor(list(sampler))
    span = TrainConfig(profile=args.profile).profile_steps
    profiler = StepProfiler(span, args.profile_dir, rank, device, print, end_step=args.steps) \
        if span else None
    tokens, t0 = 0, time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = order[(step - 1) * args.batch_size:step * args.batch_size]
        x, y = x_all[idx], y_all[idx]
        if cuda:  # pinned, without waiting: as the trainer (train.on_device)
            x, y = x.pin_memory(), y.pin_memory()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == args.warmup:
            if cuda:
                torch.cuda.synchronize()
            t0, tokens = time.perf_counter(), 0
        elif step > args.warmup:
            tokens += args.batch_size * args.context * world
        if profiler:
            profiler.after(step)
    if cuda:
        torch.cuda.synchronize()
    rate = tokens / (time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"tokens_per_s": rate, "steps": args.steps, "loss": loss.item(),
                          "params": params, "max_memory_allocated":
                          torch.cuda.max_memory_allocated(device) if cuda else None}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

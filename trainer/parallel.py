"""Data parallelism around the task's model: wrapping it (DDP or FSDP2), the gradient sync of
accumulation, clipping, DDP's bucket layout, and the ranks' batch-norm statistics.

When a model's only buffers are normalisation statistics, DDP's buffer broadcast is off and
rank 0's statistics are copied to every rank before each evaluation and checkpoint instead
(``same_statistics``): checkpoints are unchanged (docs/internals.md).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, default_collate

from torchjob.trainer.config import ConfigError, TrainConfig
from torchjob.trainer.dist import Group

RUNNING_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
# torch 2.13 renamed DDP's ``broadcast_buffers`` (deprecated, with a warning) to
# ``forward_sync_buffers``; either way the buffers are still broadcast once, at wrapping
FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(
    nn.parallel.DistributedDataParallel.__init__).parameters


def wrap(model: nn.Module, cfg: TrainConfig, group: Group,
         units: list[nn.Module] | None = None) -> nn.Module:
    """Move to the device and make data-parallel (DDP or FSDP2) when there are several ranks.
    FSDP2 shards each of ``units`` (a transformer's blocks; None: every Linear and Conv2d),
    then the root, which keeps the rest (embeddings, norms, the output layer)."""
    if cfg.sync_bn and dist.is_initialized() and group.device.type == "cpu":
        raise ConfigError("--sync-bn needs GPU devices (PyTorch's SyncBatchNorm does not run on "
                          "CPU); drop it here, or run with CUDA")
    if cfg.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(group.device)
    if cfg.compile:  # in place: the state dict keeps its keys (checkpoints do not change)
        for part in units if cfg.parallel == "fsdp" and units else [model]:
            part.compile()
    if not dist.is_initialized():
        return model
    if cfg.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        dtype = torch.bfloat16 if use_bf16(cfg.precision, group.device) else None
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if units is None:
            units = [child for child in model.modules()
                     if child is not model and isinstance(child, (nn.Linear, nn.Conv2d))]
        for child in units:
            fully_shard(child, mp_policy=policy)
        return fully_shard(model, mp_policy=policy)  # type: ignore[return-value]
    ids = [group.device.index] if group.device.type == "cuda" else None
    # gradients live in the all-reduce buckets: no copy in and out of them every step
    sync: dict[str, Any] = {} if not only_running_statistics(model) else (
        {"forward_sync_buffers": False} if FORWARD_SYNC else {"broadcast_buffers": False})
    return nn.parallel.DistributedDataParallel(model, device_ids=ids,
                                               gradient_as_bucket_view=True, **sync)


def only_running_statistics(model: nn.Module) -> bool:
    """True when the model has buffers and every one is a normalisation layer's running
    statistic (BatchNorm, SyncBatchNorm, InstanceNorm with ``track_running_stats``)."""
    found = False
    for module in model.modules():
        for name, _ in module.named_buffers(recurse=False):
            if not (isinstance(module, nn.modules.batchnorm._NormBase) and
                    name in RUNNING_STATISTICS):
                return False
            found = True
    return found


def same_statistics(model: nn.Module) -> None:
    """Give every rank rank 0's running statistics, when DDP does not broadcast them (``wrap``).
    A collective: every rank calls it at the same point (before an evaluation, a checkpoint)."""
    if not isinstance(model, nn.parallel.DistributedDataParallel) or model.broadcast_buffers:
        return
    by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for buffer in model.module.buffers():
        by_kind.setdefault((buffer.dtype, buffer.device), []).append(buffer)
    for buffers in by_kind.values():  # one broadcast per dtype (num_batches_tracked: int64)
        flat = torch.cat([b.reshape(-1) for b in buffers])
        dist.broadcast(flat, src=0)
        offset = 0
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()


def settle_buckets(model: nn.Module, optimizer: torch.optim.Optimizer, data: Dataset,
                   device: torch.device, autocast: contextlib.AbstractContextManager[Any]) -> None:
    """Make every optimizer step all-reduce with DDP's final bucket layout: one backward of zeros
    before the first step (eval mode: no dropout draw, no batch-norm update), so that a resumed
    run sums gradients in the order an uninterrupted one does (docs/internals.md)."""
    if not isinstance(model, nn.parallel.DistributedDataParallel) or \
            dist.get_world_size() < 3:  # two ranks: a + b == b + a, any layout
        return
    x = default_collate([data[i] for i in range(min(2, len(data)))])[0]  # type: ignore[arg-type]
    model.eval()
    with autocast:
        out = model(x.to(device))
    (out.float().sum() * 0).backward()
    optimizer.zero_grad(set_to_none=True)
    model.train()


def gradient_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip the gradient all-reduce on micro-steps that are not the last of an accumulation."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)  # type: ignore[operator]
        return contextlib.nullcontext()
    if sync or not isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def clip_gradients(model: nn.Module, max_norm: float, buckets: list[torch.Tensor]) -> None:
    """``nn.utils.clip_grad_norm_``, to the bit: the same norm (per gradient, in parameter order,
    whatever DDP's bucket layout) and scale, applied to DDP's flat buckets when they hold
    every gradient (fewer ops), else per gradient."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    held = {b.untyped_storage().data_ptr() for b in buckets}
    if not buckets or sum(b.numel() for b in buckets) != sum(g.numel() for g in grads) or \
            any(g.untyped_storage().data_ptr() not in held for g in grads):
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return
    total = nn.utils.get_total_norm(grads)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # as clip_grads_with_norm_
    for bucket in buckets:
        bucket.mul_(scale.to(bucket.device))


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "bf16":
        return True
    return precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


def autocast_context(precision: str, device: torch.device,
                     fsdp: bool) -> contextlib.AbstractContextManager[Any]:
    if fsdp or not use_bf16(precision, device):  # FSDP2 casts through its own policy
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

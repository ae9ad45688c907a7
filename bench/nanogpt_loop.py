"""A nanoGPT-style single-file training run (model and loop in one file, as Karpathy's nanoGPT
``model.py`` + ``train.py`` do it), the second baseline for ``--task gpt``.

The same data (the standard library bytes of torchjob.trainer.gpt, as nanoGPT's ``prepare.py`` would
write them to ``train.bin``), the same model size (layers, heads, width, context; nanoGPT's
defaults otherwise: no biases, no dropout, tied embedding and output weights) and the same
per-process batch. The loop is nanoGPT's: random windows from the byte array per step,
DDP under torchrun, ``require_backward_grad_sync`` for accumulation, gradient clipping at
1.0, warm-up and cosine learning rate, AdamW with weight decay on 2-D parameters only, fused
only on CUDA (nanoGPT's rule), no ``torch.compile`` (nanoGPT's CPU recipe, ``--compile=False``).
On CPU: gloo and fp32 (its autocast is CUDA-only). ``--device cuda``: nanoGPT's GPU recipe,
nccl, cuda:LOCAL_RANK, TF32 matmuls, bf16 autocast, pinned batches copied without blocking;
DDP only with several processes (one GPU runs nanoGPT without torchrun, hence without DDP).
nanoGPT's periodic evaluation and checkpoints are left out: the figure is training
throughput. Prints tokens/s from rank 0, measured after ``--warmup`` iterations, with the
parameter count and the peak memory (CUDA) in its JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False


class LayerNorm(nn.Module):
    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor,
                targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float,
                             betas: tuple[float, float], device_type: str) -> torch.optim.AdamW:
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        groups = [{"params": [p for p in params.values() if p.dim() >= 2],
                   "weight_decay": weight_decay},
                  {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}]
        use_fused = device_type == "cuda"
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=use_fused)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-iters", type=int, default=60)
    ap.add_argument("--learning-rate", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()

    # -- train.py: DDP set-up ----------------------------------------------------------------
    device_type = args.device
    ddp_rank, ddp_world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}" if device_type == "cuda" else "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(device)
    init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    master_process = ddp_rank == 0
    torch.manual_seed(1337 + ddp_rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ctx: Any = contextlib.nullcontext() if device_type == "cpu" else \
        torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
    gradient_accumulation_steps, grad_clip = 1, 1.0
    warmup_iters, lr_decay_iters, min_lr = 20, args.max_iters, args.learning_rate / 10

    # -- data: prepare.py's train.bin, here the same bytes in memory ------------------------
    from torchjob.trainer.gpt import stdlib_corpus
    train_data = np.frombuffer(stdlib_corpus().train, dtype=np.uint8)
    block_size, batch_size = args.block_size, args.batch_size

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(train_data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy(train_data[i:i + block_size].astype(np.int64))
                         for i in ix])
        y = torch.stack([torch.from_numpy(train_data[i + 1:i + 1 + block_size]
                                          .astype(np.int64)) for i in ix])
        if device_type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), \
                y.pin_memory().to(device, non_blocking=True)
        return x, y

    raw_model = GPT(GPTConfig(block_size=block_size, n_layer=args.n_layer, n_head=args.n_head,
                              n_embd=args.n_embd)).to(device)
    params = sum(p.numel() for p in raw_model.parameters())
    optimizer = raw_model.configure_optimizers(1e-1, args.learning_rate, (0.9, 0.95),
                                               device_type)
    model: nn.Module = raw_model
    if ddp_world_size > 1:
        model = DDP(raw_model, device_ids=[ddp_local_rank] if device_type == "cuda" else None)

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return args.learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / max(lr_decay_iters - warmup_iters, 1)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (args.learning_rate - min_lr)

    # -- train.py: the training loop ----------------------------------------------------------
    X, Y = get_batch()
    tokens, t0 = 0, time.perf_counter()
    for iter_num in range(1, args.max_iters + 1):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            if ddp_world_size > 1:
                model.require_backward_grad_sync = \
                    micro_step == gradient_accumulation_steps - 1  # type: ignore[assignment]
            with ctx:
                logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()  # prefetch the next batch, as nanoGPT does
            loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num == args.warmup:
            if device_type == "cuda":
                torch.cuda.synchronize()
            t0, tokens = time.perf_counter(), 0
        elif iter_num > args.warmup:
            tokens += batch_size * block_size * ddp_world_size * gradient_accumulation_steps
    if device_type == "cuda":
        torch.cuda.synchronize()
    rate = tokens / (time.perf_counter() - t0)
    if master_process:
        print(json.dumps({"tokens_per_s": rate, "iters": args.max_iters,
                          "loss": loss.item() * gradient_accumulation_steps, "params": params,
                          "max_memory_allocated": torch.cuda.max_memory_allocated(device)
                          if device_type == "cuda" else None}))
    destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

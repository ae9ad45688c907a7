"""A plain PyTorch DDP script, run by torchjob as a user's own script (``trainer.script``).

It knows nothing of torchjob: it reads the launcher's environment (``init_method="env://"``),
trains a small regression with DistributedDataParallel and writes ``RUN_DIR/result.json`` on
rank 0; the run directory is ``--run-dir``, by default ``TORCHJOB_RUN_DIR``, set by torchjob.

    torchjob run jobs/examples/script.yaml
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=os.environ.get("TORCHJOB_RUN_DIR", "runs/script"),
                        help="default: $TORCHJOB_RUN_DIR (set by torchjob), else runs/script")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(0)
        true_w = torch.randn(8, 1)
        model = DistributedDataParallel(torch.nn.Linear(8, 1).to(device),
                                        device_ids=[local_rank] if cuda else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own samples
        loss = torch.tensor(0.0)
        for _ in range(args.steps):
            x = torch.randn(32, 8, generator=gen)
            y = x @ true_w
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        final = loss.detach().clone()
        dist.all_reduce(final)
        if rank == 0:
            out = Path(args.run_dir)
            out.mkdir(parents=True, exist_ok=True)
            result = {"world_size": world, "steps": args.steps,
                      "final_loss": final.item() / world}
            (out / "result.json").write_text(json.dumps(result) + "\n")
            print(f"rank 0 of {world}: final loss {result['final_loss']:.6f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

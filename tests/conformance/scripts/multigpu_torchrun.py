"""A third-party training script, written as pytorch/examples' ddp-tutorial-series
``multigpu_torchrun.py`` is (positional ``total_epochs save_every``, ``--batch_size``), that
knows nothing of torchjob: torchrun's environment, a snapshot every ``save_every`` epochs.

For the conformance matrix it also writes what it was given to ``$TORCHJOB_RUN_DIR/
env-RANK.json``: its argv and parsed arguments, the launcher's environment, ``sys.path[0]``
and the working directory. An unknown option is argparse's usage error (exit 2).
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "TORCHELASTIC_MAX_RESTARTS", "TORCHJOB_RUN_DIR", "TORCHJOB_CHECKPOINT_DIR")


def main() -> None:
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size")
    parser.add_argument("overrides", nargs="*", help="hydra-style a.b=c")
    args = parser.parse_args()
    seen = {"argv": sys.argv[1:], "parsed": vars(args), "path0": sys.path[0],
            "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in LAUNCHER_ENV}}

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(rank)
    for epoch in range(args.total_epochs):
        for _ in range(4):
            source = torch.randn(args.batch_size, 20, generator=data)
            loss = torch.nn.functional.mse_loss(model(source), source.sum(1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0 and epoch % args.save_every == 0:
            snapshot = os.path.join(os.environ["TORCHJOB_CHECKPOINT_DIR"], "snapshot.pt")
            os.makedirs(os.path.dirname(snapshot), exist_ok=True)
            torch.save({"model": model.module.state_dict(), "epochs_run": epoch}, snapshot)
    os.makedirs(os.environ["TORCHJOB_RUN_DIR"], exist_ok=True)
    with open(os.path.join(os.environ["TORCHJOB_RUN_DIR"], f"env-{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

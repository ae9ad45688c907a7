"""A user's training script that knows nothing of torchjob (no progress calls): gloo, an
optimizer, an all-reduce per step. On the first attempt, rank CULPRIT enters a hang SHAPE at
step AT (before that step's all-reduce; 1: before the first collective of all) or at init
(before init_process_group) while the others wait for it in the all-reduce or in
init_process_group: ``hang_shapes.py SHAPE CULPRIT AT [TIMEOUT]`` with SHAPE stop (SIGSTOP:
state T), loop (a Python busy loop), sleep (time.sleep) or io (a read of a pipe nobody
writes); TIMEOUT: the process group's timeout in seconds (torch's default when absent)."""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def stop_here() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def spin_here() -> None:
    n = 0
    while True:
        n += 1


def sleep_here() -> None:
    time.sleep(3600)


def read_here() -> None:
    readable, _ = os.pipe()
    os.read(readable, 1)


SHAPES = {"stop": stop_here, "loop": spin_here, "sleep": sleep_here, "io": read_here}


def hang(shape: str, rank: int) -> None:
    print(f"rank {rank} hangs: {shape}", flush=True)
    SHAPES[shape]()


def main() -> None:
    shape, culprit, at = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if at == "init" and int(os.environ["RANK"]) == culprit and first:
        hang(shape, culprit)
    timeout = {"timeout": datetime.timedelta(seconds=float(sys.argv[4]))} \
        if len(sys.argv) > 4 else {}
    dist.init_process_group("gloo", **timeout)
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 21):
        if str(step) == at and rank == culprit and first:
            hang(shape, rank)
        model(torch.ones(8, 4)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

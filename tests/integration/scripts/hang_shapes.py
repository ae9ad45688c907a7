"""A user's training script that knows nothing of torchjob (no progress calls): gloo, an
optimizer, an all-reduce per step. On the first attempt, rank CULPRIT enters a hang SHAPE at
step AT (before that step's all-reduce; 1: before the first collective of all) or at init
(before init_process_group) while the others wait for it in the all-reduce or in
init_process_group: ``hang_shapes.py SHAPE CULPRIT AT [TIMEOUT]`` with SHAPE stop (SIGSTOP:
state T), loop (a Python busy loop), sleep (time.sleep) or io (a read of a pipe nobody
writes); TIMEOUT: the process group's timeout in seconds (torch's default when absent). At init, rank
0 enters init_process_group only once every other rank is about to (``all_at_init``)."""

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


def all_at_init(culprit: int) -> None:
    """Rank 0, the store's host, enters init_process_group (where its timeout starts) only
    once every other rank but the culprit is about to: a node that started later (under
    load, by more than the timeout) lost its peers without having waited there, which is
    not the case under test. Each says so by a file in the run directory (one host)."""
    run, rank = os.environ["TORCHJOB_RUN_DIR"], int(os.environ["RANK"])
    if rank != 0:
        open(os.path.join(run, f"at-init-{rank}"), "w").close()
        return
    others = [r for r in range(1, int(os.environ["WORLD_SIZE"])) if r != culprit]
    deadline = time.monotonic() + 300
    while not all(os.path.exists(os.path.join(run, f"at-init-{r}")) for r in others):
        if time.monotonic() > deadline:
            sys.exit(f"rank 0: ranks {others} did not all reach init within 300 s")
        time.sleep(0.05)


def main() -> None:
    shape, culprit, at = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if at == "init" and int(os.environ["RANK"]) == culprit and first:
        hang(shape, culprit)
    if at == "init" and first:
        all_at_init(culprit)
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else None
    if seconds is not None and at == "init" and first and int(os.environ["RANK"]) != 0:
        # the store's host gives up first, as the case says: with one timeout for all, a rank
        # waiting for rank 0's address (rank 0 itself waits for the culprit) timed out a few
        # milliseconds before rank 0 under load in CI, and the culprit went unnamed
        seconds += 20
    timeout = {"timeout": datetime.timedelta(seconds=seconds)} if seconds is not None else {}
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

"""The data position rule (trainer.data), with every rank of a world simulated in one process:
a run stopped after any step and resumed at any world size trains on each remaining sample of
the epoch exactly once, leaving out only a tail shorter than one of its optimizer steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler, TensorDataset

from torchjob.trainer.data import TrainBatches
from torchjob.trainer.samples import trained


def world(n: int, size: int, batch: int, accum: int,
          data: Dataset | None = None) -> list[TrainBatches]:
    data = data if data is not None else TensorDataset(torch.arange(n), torch.zeros(n))
    return [TrainBatches(data, batch_size=batch, grad_accum=accum, world_size=size, rank=r,
                         seed=7, num_workers=0) for r in range(size)]


def steps(ranks: list[TrainBatches], epoch: int, position: int) -> list[list[int]]:
    """The samples of each optimizer step from ``position`` on, all ranks together."""
    accum = ranks[0].grad_accum
    per_rank = [[x.tolist() for x, _ in r.epoch(epoch, position)] for r in ranks]
    assert len({len(m) for m in per_rank}) == 1, "ranks disagree on the number of batches"
    return [[i for m in per_rank for b in m[s * accum:(s + 1) * accum] for i in b]
            for s in range(len(per_rank[0]) // accum)]


@pytest.mark.parametrize("n, batch, accum, before, after", [
    (1437, 16, 2, 4, 3),   # the digits set: 4 -> 3 divides neither the data nor 4
    (1437, 16, 2, 4, 2),
    (1437, 32, 1, 2, 4),
    (1437, 8, 3, 3, 4),
    (1000, 5, 1, 4, 5),
    (97, 3, 1, 1, 3),
    (97, 2, 2, 5, 2),
    (64, 4, 2, 2, 2),      # the same world size: exactly the uninterrupted batches
])
def test_a_resume_after_any_step_sees_the_rest_of_the_epoch_once(
        n: int, batch: int, accum: int, before: int, after: int) -> None:
    old, new = world(n, before, batch, accum), world(n, after, batch, accum)
    uninterrupted = steps(old, 3, 0)
    assert len(uninterrupted) == old[0].steps_per_epoch == n // (before * batch * accum)
    for done in range(len(uninterrupted) + 1):
        position = done * old[0].step_samples
        rest = steps(new, 3, position)
        seen = [i for s in uninterrupted[:done] + rest for i in s]
        assert len(seen) == len(set(seen)), f"a sample seen twice after a stop at step {done}"
        assert len(seen) == position + len(rest) * new[0].step_samples
        assert n - len(seen) < new[0].step_samples, "more than a step's tail left out"
        assert len(rest) == new[0].steps_after(position)
        if before == after:
            assert rest == uninterrupted[done:]


def test_the_run_ends_after_the_steps_the_new_world_size_has_left() -> None:
    """12 epochs of the digits: 2 ranks do 22 steps an epoch, 4 ranks 11. Grown from 2 to 4
    after 100 steps (4 epochs and 12 steps: 768 samples), the run has 5 steps left in that
    epoch and 7 epochs of 11; the end used to be 12 x 11 = 132, 4.5 epochs short."""
    four = world(1437, 4, 32, 1)[0]
    assert four.steps_to_end(4, 12 * 2 * 32, 12) == 5 + 7 * 11
    assert four.steps_to_end(0, 0, 12) == 12 * 11  # fresh: the uninterrupted run's
    assert four.steps_to_end(12, 0, 12) == 0       # done


@pytest.mark.parametrize("n, size, batch", [(1437, 2, 32), (1437, 4, 16), (1437, 5, 32),
                                            (10, 4, 1)])
def test_an_epoch_is_distributed_samplers_order_without_its_padding(n: int, size: int,
                                                                    batch: int) -> None:
    """Each rank trains on a prefix of what DistributedSampler(shuffle=True) gives it: the same
    runs as before wherever the padding (repeats of the first samples) was never reached."""
    for rank in world(n, size, batch, 1):
        sampler = DistributedSampler(rank.dataset, num_replicas=size, rank=rank.rank,
                                     shuffle=True, seed=7, drop_last=False)
        sampler.set_epoch(2)
        mine = rank.order(2, 0)
        assert mine == list(sampler)[:len(mine)]
        assert len(mine) == n // (size * batch) * batch


class Listed(Dataset):
    """Not a TensorDataset: read through a DataLoader."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.tensor(0)


def test_the_data_loader_path_gives_the_same_batches_and_indices() -> None:
    fast, loader = world(101, 3, 4, 2)[1], world(101, 3, 4, 2, Listed(101))[1]
    got = [(x.tolist(), list(loader.indices), loader.position) for x, _ in loader.epoch(0, 48)]
    want = [(x.tolist(), list(fast.indices), fast.position) for x, _ in fast.epoch(0, 48)]
    assert got == want and got[0][2] == 48 + 12 and all(g[0] == g[1] for g in got)


def test_a_later_attempt_replaces_what_was_recorded_after_its_checkpoint(tmp_path: Path) -> None:
    def attempt(number: int, world_size: int, resumed: int, records: list[tuple[int, list[int]]]
                ) -> None:
        for rank in range(world_size):
            lines = [{"attempt": number, "world_size": world_size, "rank": rank,
                      "resumed": {"step": resumed, "epoch": 0, "samples": 0}}]
            lines += [{"step": s, "epoch": 0, "indices": [i * 10 + rank for i in idx]}
                      for s, idx in records]
            (tmp_path / "samples").mkdir(exist_ok=True)
            (tmp_path / "samples" / f"attempt{number:03d}-rank{rank}.jsonl").write_text(
                "".join(json.dumps(line) + "\n" for line in lines))

    attempt(1, 2, 0, [(1, [1]), (2, [2]), (3, [3]), (4, [4])])  # checkpoint at 2, died in 4
    attempt(2, 3, 2, [(3, [5]), (4, [6])])
    assert sorted(trained(tmp_path)[0]) == [10, 11, 20, 21, 50, 51, 52, 60, 61, 62]

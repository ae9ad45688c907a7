"""Batches for one rank, from any point of an epoch, at any world size.

Epoch ``e`` is DistributedSampler's permutation for ``seed + e``; the position in it is global
(the samples all ranks together trained on); each optimizer step takes the next
``world_size x batch_size x grad_accum`` of them, interleaved over the ranks, and an epoch's
tail too short for one more step is left out, never padded. So a run resumed at any world
size trains on each remaining sample once (the rule in full: docs/internals.md).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

Batch = tuple[torch.Tensor, torch.Tensor]


class TrainBatches:
    """Micro-batches of one epoch for this rank, fast for in-memory tensors.

    While an epoch is read, ``indices`` holds the dataset indices of the micro-batch last
    yielded and ``position`` the global position after it (samples done by all ranks)."""

    def __init__(self, dataset: Dataset, *, batch_size: int, grad_accum: int, world_size: int,
                 rank: int, seed: int, num_workers: int) -> None:
        self.dataset = dataset
        self.size = len(dataset)  # type: ignore[arg-type]
        self.batch_size, self.grad_accum = batch_size, grad_accum
        self.world_size, self.rank, self.seed = world_size, rank, seed
        self.num_workers = num_workers
        self.step_samples = world_size * batch_size * grad_accum  # one optimizer step, all ranks
        self.steps_per_epoch = self.steps_after(0)
        self.indices: list[int] = []
        self.position = 0

    def steps_after(self, position: int) -> int:
        """Optimizer steps left in an epoch once ``position`` samples of it are done."""
        return max(self.size - position, 0) // self.step_samples

    def steps_to_end(self, epoch: int, position: int, epochs: int) -> int:
        """Optimizer steps from ``position`` in ``epoch`` to the end of epoch ``epochs - 1``:
        after a resize, the steps the new world size has left (the schedule's end follows)."""
        if epoch >= epochs:
            return 0
        return self.steps_after(position) + self.steps_per_epoch * (epochs - epoch - 1)

    def order(self, epoch: int, position: int) -> list[int]:
        """This rank's dataset indices for the rest of ``epoch`` after ``position``."""
        gen = torch.Generator()
        gen.manual_seed(self.seed + epoch)  # as DistributedSampler(shuffle=True) seeds it
        perm = torch.randperm(self.size, generator=gen).tolist()
        end = position + self.steps_after(position) * self.step_samples
        return perm[position + self.rank:end:self.world_size]

    def epoch(self, epoch: int, position: int = 0) -> Iterator[Batch]:
        """The micro-batches of ``epoch`` after its first ``position`` samples (all ranks)."""
        mine = self.order(epoch, position)
        self.position = position
        batches = self._tensor_batches(mine) if isinstance(self.dataset, TensorDataset) and \
            self.num_workers == 0 else iter(DataLoader(
                self.dataset, batch_size=self.batch_size, sampler=mine,
                num_workers=self.num_workers, drop_last=True, persistent_workers=False))
        for batch, start in zip(batches, range(0, len(mine), self.batch_size)):
            self.indices = mine[start:start + self.batch_size]  # in order, workers or not
            self.position += self.batch_size * self.world_size
            yield batch

    def _tensor_batches(self, indices: list[int]) -> Iterator[Batch]:
        x, y = self.dataset.tensors[0], self.dataset.tensors[1]  # type: ignore[attr-defined]
        order = torch.tensor(indices, dtype=torch.long)
        for start in range(0, len(indices) - self.batch_size + 1, self.batch_size):
            idx = order[start:start + self.batch_size]
            yield x[idx], y[idx]


def eval_batches(dataset: Dataset, *, batch_size: int, world_size: int,
                 rank: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """This rank's share of the evaluation set, every sample counted exactly once.

    Yields (inputs, labels, weight) with the same number of batches on every rank (ranks short of
    data repeat a sample with weight 0), because sharded models need every rank in every forward.
    """
    n = len(dataset)  # type: ignore[arg-type]
    mine = list(range(rank, n, world_size))
    most = (n + world_size - 1) // world_size
    for start in range(0, most, batch_size):
        idx = mine[start:start + batch_size]
        weight = torch.ones(len(idx))
        if not idx:  # this rank has run out; keep step with the others
            idx, weight = [0], torch.zeros(1)
        if isinstance(dataset, TensorDataset):
            pick = torch.tensor(idx, dtype=torch.long)
            yield dataset.tensors[0][pick], dataset.tensors[1][pick], weight
            continue
        items = [dataset[i] for i in idx]
        yield (torch.stack([torch.as_tensor(it[0]) for it in items]),
               torch.stack([torch.as_tensor(it[1]) for it in items]), weight)

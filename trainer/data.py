"""Batches for one rank: a DistributedSampler that can start in the middle of an epoch.

The order of epoch ``e`` depends only on (seed, e, world size), so a resumed run that skips the
micro-batches already consumed sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

Batch = tuple[torch.Tensor, torch.Tensor]


class ResumableSampler(DistributedSampler):
    """DistributedSampler whose next epoch can skip its first ``start`` samples."""

    def __init__(self, dataset: Dataset, *, world_size: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                         seed=seed, drop_last=False)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start:])

    def __len__(self) -> int:
        return self.num_samples - self.start


class TrainBatches:
    """Micro-batches of one epoch for this rank, fast for in-memory tensors."""

    def __init__(self, dataset: Dataset, *, batch_size: int, world_size: int, rank: int,
                 seed: int, num_workers: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = ResumableSampler(dataset, world_size=world_size, rank=rank, seed=seed)
        self.num_workers = num_workers
        self.per_epoch = self.sampler.num_samples // batch_size  # full micro-batches only

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        """The micro-batches of ``epoch`` after the first ``skip`` of them."""
        self.sampler.set_epoch(epoch)
        self.sampler.start = skip * self.batch_size
        if isinstance(self.dataset, TensorDataset) and self.num_workers == 0:
            yield from self._tensor_batches(list(self.sampler))
            return
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=self.sampler,
                            num_workers=self.num_workers, drop_last=True,
                            persistent_workers=False)
        yield from loader

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

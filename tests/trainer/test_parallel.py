"""trainer.parallel: DDP without the per-forward broadcast of batch-norm statistics gives rank 0
the very statistics (and every rank the very weights) that DDP's broadcast gives, and
``same_statistics`` hands them to every rank."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from torch import nn

from tests.procs import PYTHON, env_for_tests
from torchjob.trainer.parallel import only_running_statistics
from torchjob.trainer.tasks import DigitsCNN

HERE = Path(__file__).resolve().parent


class Masked(nn.Module):
    """A buffer that a forward reads: DDP must keep broadcasting it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("mask", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.mask


def test_only_running_statistics_are_left_unbroadcast() -> None:
    assert only_running_statistics(DigitsCNN())
    assert only_running_statistics(nn.SyncBatchNorm(3))
    assert not only_running_statistics(Masked())
    assert not only_running_statistics(nn.Linear(3, 3))  # no buffers: nothing to decide
    assert not only_running_statistics(nn.InstanceNorm2d(3))  # no running statistics kept
    assert only_running_statistics(nn.InstanceNorm2d(3, track_running_stats=True))


def test_rank_0_statistics_and_all_weights_match_ddps_broadcast(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    subprocess.run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    "2", str(HERE / "bn_ranks.py"), str(out)],
                   env=env_for_tests(), check=True, timeout=300, capture_output=True)
    rank0, rank1 = json.loads(out.read_text())
    assert rank0["broadcast_buffers"] is False
    names = list(DigitsCNN().state_dict())
    stats = [i for i, name in enumerate(names) if name.endswith(("running_mean", "running_var"))]
    assert stats
    for seen in (rank0, rank1):  # the weights: the same to the bit on either rank
        for i, name in enumerate(names):
            if i not in stats and not name.endswith("num_batches_tracked"):
                assert seen["ours"][i] == seen["reference"][i], name
    for i in stats:  # rank 0's statistics: exactly DDP's, whose forwards start from rank 0's
        assert rank0["ours"][i] == rank0["reference"][i], names[i]
    assert any(rank1["ours"][i] != rank0["ours"][i] for i in stats)  # drifted, unread
    for i in range(len(names)):  # after same_statistics: rank 0's everywhere
        assert rank1["ours_synced"][i] == rank0["ours"][i], names[i]

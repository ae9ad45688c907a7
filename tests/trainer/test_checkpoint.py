"""Checkpoints in one process: atomic, verified, pruned, and resumed past damage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchjob.trainer.checkpoint import (CheckpointError, Checkpointer, CheckpointWriteError,
                                         Position, verify)
from torchjob.trainer.config import ConfigError
from torchjob.trainer.tasks import DigitsCNN


def make(tmp_path: Path, *, keep: int = 3, async_save: bool = False,
         messages: list[str] | None = None) -> Checkpointer:
    said = messages if messages is not None else []
    return Checkpointer(str(tmp_path / "ck"), rank=0, world_size=1, keep=keep,
                        async_save=async_save, sharded=False, config={"seed": 0},
                        say=said.append)


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = DigitsCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_save_then_restore_is_exact(tmp_path: Path) -> None:
    model, opt = model_and_optimizer(0)
    ck = make(tmp_path)
    ck.save(Position(5, 0, 5), model, opt)
    ck.close()
    manifest = verify(tmp_path / "ck" / "step_00000005")
    assert manifest["position"] == {"step": 5, "epoch": 0, "samples": 5}
    assert set(manifest["files"]) == {"state.pt", "rng-rank0.pt"}

    other, other_opt = model_and_optimizer(1)
    pos = make(tmp_path).restore(other, other_opt, torch.device("cpu"))
    assert pos == Position(5, 0, 5)
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"],
                       other_opt.state_dict()["state"][0]["exp_avg"])


def test_async_save_writes_the_state_of_the_moment(tmp_path: Path) -> None:
    model, opt = model_and_optimizer(0)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_opt = [s["exp_avg"].clone() for s in opt.state_dict()["state"].values()]
    ck = make(tmp_path, async_save=True)
    for step in (1, 2):  # the second save reuses the first one's host buffers
        ck.save(Position(step, 0, step), model, opt)
        for _ in range(3):  # training goes on: buffers change in forward, the rest in step
            model(torch.randn(4, 1, 8, 8)).sum().backward()
            opt.step()
        if step == 1:
            expected_2 = {k: v.clone() for k, v in model.state_dict().items()}
    ck.close()
    saved = torch.load(tmp_path / "ck/step_00000001/state.pt", weights_only=True)
    assert all(torch.equal(saved["model"][k], expected[k]) for k in expected)
    assert all(torch.equal(s["exp_avg"], e)
               for s, e in zip(saved["optim"]["state"].values(), expected_opt))
    saved = torch.load(tmp_path / "ck/step_00000002/state.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], expected_2[k]) for k in expected_2)
    assert not all(torch.equal(saved[k], expected[k]) for k in expected)


def test_keeps_the_newest_n(tmp_path: Path) -> None:
    model, opt = model_and_optimizer(0)
    ck = make(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        ck.save(Position(step, 0, step), model, opt)
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == ["step_00000003", "step_00000004"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-manifest", "bad-manifest",
                                    "missing-file"])
def test_damaged_newest_falls_back_with_a_reason(tmp_path: Path, damage: str) -> None:
    model, opt = model_and_optimizer(0)
    ck = make(tmp_path)
    ck.save(Position(1, 0, 1), model, opt)
    ck.save(Position(2, 0, 2), model, opt)
    newest = tmp_path / "ck" / "step_00000002"
    state = newest / "state.pt"
    if damage == "truncate":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif damage == "flip":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    elif damage == "no-manifest":
        (newest / "manifest.json").unlink()
    elif damage == "bad-manifest":
        (newest / "manifest.json").write_text("{not json")
    else:
        state.unlink()
    with pytest.raises(CheckpointError):
        verify(newest)
    said: list[str] = []
    pos = make(tmp_path, messages=said).restore(*model_and_optimizer(3), torch.device("cpu"))
    assert pos.step == 1
    assert any("skipping checkpoint step_00000002" in m for m in said), said


def test_resuming_past_a_damaged_one_rewrites_its_step(tmp_path: Path) -> None:
    """Fell back from damaged step 2 to step 1: the run's own step 2 replaces the damaged one,
    and pruning with keep=1 never removes the fresh checkpoint for the damaged newer one."""
    model, opt = model_and_optimizer(0)
    ck = make(tmp_path, keep=3)
    for step in (1, 2, 3):
        ck.save(Position(step, 0, step), model, opt)
    for name in ("step_00000002", "step_00000003"):
        (tmp_path / "ck" / name / "state.pt").write_bytes(b"damaged")
    said: list[str] = []
    again = make(tmp_path, keep=1, messages=said)
    assert again.restore(*model_and_optimizer(1), torch.device("cpu")).step == 1
    again.save(Position(2, 0, 2), model, opt)
    again.close()
    verify(tmp_path / "ck" / "step_00000002")
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == ["step_00000002", "step_00000003"], names
    assert any("replacing step_00000002" in m for m in said), said


def test_unfinished_save_is_ignored_and_cleaned(tmp_path: Path) -> None:
    model, opt = model_and_optimizer(0)
    make(tmp_path).save(Position(1, 0, 1), model, opt)
    stale = tmp_path / "ck" / ".tmp-step_00000002-deadbeef"
    stale.mkdir()
    (stale / "state.pt").write_bytes(b"half")
    pos = make(tmp_path).restore(*model_and_optimizer(1), torch.device("cpu"))
    assert pos.step == 1 and not stale.exists()


def test_no_checkpoint_starts_fresh(tmp_path: Path) -> None:
    assert make(tmp_path).restore(*model_and_optimizer(0), torch.device("cpu")) == Position()


def test_layout_mismatch_is_a_config_error(tmp_path: Path) -> None:
    model, opt = model_and_optimizer(0)
    make(tmp_path).save(Position(1, 0, 1), model, opt)
    manifest_path = tmp_path / "ck/step_00000001/manifest.json"
    manifest = json.loads(manifest_path.read_text())
    sharded = Checkpointer(str(tmp_path / "ck"), rank=0, world_size=1, keep=3,
                           async_save=False, sharded=True, config={"seed": 0}, say=lambda m: None)
    assert manifest["layout"] == "replicated"
    with pytest.raises(ConfigError, match="--parallel"):
        sharded.restore(model, opt, torch.device("cpu"))


def test_a_position_written_in_micro_batches_is_read_in_samples() -> None:
    """Checkpoints from before positions were global kept micro-batches per rank."""
    old = {"position": {"step": 40, "epoch": 1, "micro": 6}, "world_size": 2,
           "config": {"batch_size": 32}}
    assert Position.from_manifest(old) == Position(40, 1, 6 * 32 * 2)
    new = {"position": {"step": 40, "epoch": 1, "samples": 384}, "world_size": 3, "config": {}}
    assert Position.from_manifest(new) == Position(40, 1, 384)


def test_a_save_that_fails_for_another_reason_is_said_as_an_exception(tmp_path: Path) -> None:
    """torch.distributed.checkpoint raises a BaseException (no Exception): torchrun's error
    file and the agent's verdict see only Exceptions, so one that is no file system's refusal
    becomes a RuntimeError naming the checkpoint; a plain Exception goes as it came."""
    class CheckpointException(BaseException):
        pass

    ck = make(tmp_path)
    with pytest.raises(RuntimeError, match=r"^saving checkpoint step_00000007 failed: "
                                           r"CheckpointException ranks:dict_keys\(\[1\]\)$"):
        with ck._writing(tmp_path / ".tmp-x", "step_00000007"):
            raise CheckpointException("CheckpointException ranks:dict_keys([1])\nTraceback")
    with pytest.raises(ValueError, match="^a bug$"):
        with ck._writing(tmp_path / ".tmp-x", "step_00000007"):
            raise ValueError("a bug")
    (tmp_path / ".tmp-x").mkdir()
    (tmp_path / "ck").mkdir()
    with pytest.raises(CheckpointWriteError, match=r"^cannot write checkpoint step_00000007 in "
                       r".*/ck: Disk quota exceeded \(\d+ MiB free there\); none was written"):
        with ck._writing(tmp_path / ".tmp-x", "step_00000007"):
            raise OSError(122, "Disk quota exceeded")
    assert not (tmp_path / ".tmp-x").exists()  # what it wrote is removed
    ck.close()

"""Checkpoints know their job (trainer.fingerprint): which changes are refused, which resume,
and what --fresh does with the checkpoints it finds. Runs on every backend: the conformance
matrix's 'changed config' row."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from torchjob.trainer.checkpoint import FRESH_MARKER, Checkpointer
from torchjob.trainer.config import TrainConfig
from torchjob.trainer.fingerprint import TRAJECTORY, differences, digest, refusal
from torchjob.trainer.train import resume_mode

BASE = dataclasses.asdict(TrainConfig())


def changed(**fields: object) -> dict[str, object]:
    return {**BASE, **fields}


@pytest.mark.parametrize("fields", [
    {"epochs": 40}, {"max_steps": 1000},  # training extended: the same trajectory goes on
    {"log_every": 1, "eval_every": 0, "checkpoint_every": 5, "progress": "lines"},
    {"run_dir": "elsewhere", "checkpoint_dir": "x", "keep_checkpoints": 9},
    {"pg_timeout": 30.0, "backend": "gloo", "num_workers": 2, "stop_grace": 5.0,
     "log_samples": True},
    {"async_checkpoint": True, "resume": False},
])
def test_what_only_extends_or_watches_the_training_is_no_difference(fields: dict) -> None:
    assert differences(BASE, changed(**fields)) == []


def test_each_difference_is_named_with_its_old_and_new_value() -> None:
    diffs = differences(BASE, changed(lr=0.01, task="synthetic", seed=3))
    assert diffs == [("task", "digits", "synthetic"), ("lr", 0.003, 0.01), ("seed", 0, 3)]
    text = refusal("runs/x/checkpoints", diffs)
    assert "task: 'digits' -> 'synthetic'; lr: 0.003 -> 0.01; seed: 0 -> 3" in text
    assert "--fresh" in text and "--resume=force" in text and "runs/x/checkpoints" in text


def test_the_digest_changes_with_the_trajectory_only() -> None:
    assert digest(BASE) == digest(changed(epochs=99, log_every=1))
    assert digest(BASE) != digest(changed(lr=0.01))


def test_every_trajectory_field_is_a_trainer_option() -> None:
    assert set(TRAJECTORY) <= set(BASE)


def test_a_checkpoint_of_an_older_trainer_lacks_fields_and_is_still_resumed() -> None:
    old = {k: v for k, v in BASE.items() if k != "grad_accum"}
    assert differences(old, changed(grad_accum=4)) == []


def test_the_resume_mode_comes_from_the_launcher() -> None:
    cfg = TrainConfig()
    assert resume_mode(cfg, {}) == ""
    assert resume_mode(cfg, {"TORCHJOB_RESUME": "force"}) == "force"
    assert resume_mode(cfg, {"TORCHJOB_RESUME": "fresh:job-1a2b3c"}) == "fresh:job-1a2b3c"
    assert resume_mode(cfg, {"TORCHJOB_RESUME": "fresh", "TORCHELASTIC_RUN_ID": "42"}) == \
        "fresh:42"
    never = resume_mode(TrainConfig(resume=False), {})  # a new token each start
    assert never.startswith("fresh:") and never != resume_mode(TrainConfig(resume=False), {})


def checkpointer(root: Path, resume: str) -> Checkpointer:
    return Checkpointer(str(root), rank=0, world_size=1, keep=3, async_save=False,
                        sharded=False, config=BASE, say=print, resume=resume)


def test_fresh_moves_the_old_checkpoints_aside_once_per_submission(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    (root / "step_00000010").mkdir(parents=True)
    assert checkpointer(root, "fresh:a")._choose() is None
    assert list(root.iterdir()) == [root / FRESH_MARKER]
    [aside] = tmp_path.glob("checkpoints.old-*")
    assert (aside / "step_00000010").is_dir()  # moved, never deleted
    (root / "step_00000020").mkdir()  # this submission's own, then it restarts
    checkpointer(root, "fresh:a")._choose()
    assert (root / "step_00000020").is_dir() and len(list(tmp_path.glob("*.old-*"))) == 1
    checkpointer(root, "fresh:b")._choose()  # the next submission with --fresh
    assert not (root / "step_00000020").exists() and len(list(tmp_path.glob("*.old-*"))) == 2

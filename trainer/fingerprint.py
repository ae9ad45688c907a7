"""What a checkpoint belongs to: the trainer settings that define the training trajectory. Pure.

A run refuses a checkpoint made with other values of them (exit 2, naming each difference).
``TORCHJOB_RESUME`` (``contract.RESUME_ENV``) says how a run treats checkpoints: unset, resume
when the fingerprint matches; ``force``, resume anyway; ``fresh:TOKEN``, set the old ones
aside once per TOKEN and start over. What is left out, and why: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

TRAJECTORY = ("task", "batch_size", "grad_accum", "lr", "weight_decay", "warmup_steps",
              "schedule", "clip_grad", "precision", "parallel", "sync_bn", "seed",
              "synthetic_samples", "synthetic_dim", "synthetic_hidden", "synthetic_layers",
              "synthetic_classes", "gpt_layers", "gpt_heads", "gpt_width", "gpt_context")
# Not options: what a task read from the machine (Task.identity), added by the trainer
DATA = "data"


def fingerprint(config: Mapping[str, Any]) -> dict[str, Any]:
    """The trajectory-defining part of a trainer config (``dataclasses.asdict(TrainConfig)``)."""
    return {name: config[name] for name in (*TRAJECTORY, DATA) if name in config}


def digest(config: Mapping[str, Any]) -> str:
    """A short hash of the fingerprint, for the manifest and for people comparing runs (the
    refusal itself compares the fields, so that it can name them)."""
    text = json.dumps(fingerprint(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, old value, new value) for each trajectory field that differs; a field the old
    config lacks (written by an older trainer) is not a difference, nor is ``data`` when the
    new config lacks it (a launcher's, which reads no data)."""
    before, after = fingerprint(old), fingerprint(new)
    return [(name, before[name], after.get(name)) for name in (*TRAJECTORY, DATA)
            if name in before and before[name] != after.get(name)
            and (name != DATA or name in after)]


def refusal(where: str, diffs: list[tuple[str, Any, Any]]) -> str:
    """The message of a run that finds checkpoints of another configuration."""
    changed = "; ".join(f"{name.replace('_', '-')}: {old!r} -> {new!r}"
                        for name, old, new in diffs)
    return (f"the checkpoints in {where} were written with another configuration ({changed}), "
            "so resuming them would not continue that training. Either start over: torchjob "
            "run --fresh (the old checkpoints are moved aside, not deleted), or resume them "
            "anyway: torchjob run --resume=force (or put the old values back)")

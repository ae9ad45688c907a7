"""Sweeps: ``--sweep lr=1e-3,3e-3`` over trainer arguments, the grid of all values given.

Each point is the spec with those trainer arguments, in its own run directory
(``RUN_DIR/lr=0.001``) and with its own name (``NAME-0``, ``NAME-1``: a cluster's objects need
names of their own). A backend that has job arrays (Slurm) submits the points as one
array; on the others a sweep is a set of jobs, one per point. Pure.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import FrozenMap, SpecError

Sweep = Mapping[str, Sequence[str]]


def parse_sweep(texts: Sequence[str]) -> dict[str, list[str]]:
    """``["lr=1e-3,3e-3"]`` -> ``{"lr": ["1e-3", "3e-3"]}``."""
    sweep: dict[str, list[str]] = {}
    for text in texts:
        key, eq, values = text.partition("=")
        if not eq or not values or not key or any(not v for v in values.split(",")):
            raise SpecError("--sweep", f"{text!r} is not ARG=V1,V2,...: write trainer_arg=v1,v2 "
                            "e.g. lr=1e-3,3e-3")
        sweep[key] = values.split(",")
    return sweep


def sweep_specs(spec: JobSpec, sweep: Sweep) -> list[JobSpec]:
    """One spec per point of the grid ``{trainer arg: values}``, each in its own run dir."""
    from torchjob.trainer.config import field_types

    if isinstance(spec.trainer.args, tuple):
        raise SpecError("trainer.args", "is a list of words, but a sweep sets trainer arguments "
                        "by name: write trainer.args as a mapping (lr: 1e-3) to sweep it")
    types = field_types()
    for key in sweep:
        if key not in types or key in ("run_dir", "checkpoint_dir"):
            raise SpecError(f"sweep.{key}", "is not a trainer argument (e.g. lr=1e-3,3e-3)")
    out = []
    for index, point in enumerate(itertools.product(*(list(v) for v in sweep.values()))):
        args: dict[str, Any] = dict(spec.trainer.args)
        label = []
        for key, value in zip(sweep, point):
            try:
                args[key] = _typed(types[key], value)
            except ValueError:
                raise SpecError(f"sweep.{key}", f"{value!r} is not a {types[key].__name__}") \
                    from None
            label.append(f"{key}={value}")
        run_dir = f"{spec.run_dir}/{','.join(label)}"
        out.append(dataclasses.replace(
            spec, name=f"{spec.name}-{index}",
            trainer=dataclasses.replace(spec.trainer, args=FrozenMap(args)),
            run_dir=run_dir, checkpoint_dir=_swept_checkpoint_dir(spec, run_dir)))
    return out


def _typed(kind: type, value: str) -> Any:
    if kind is bool:
        return value.lower() in ("1", "true", "yes", "on")
    return kind(value)


def _swept_checkpoint_dir(spec: JobSpec, run_dir: str) -> str:
    default = f"{spec.run_dir}/checkpoints"
    return f"{run_dir}/checkpoints" if spec.checkpoint_dir == default else \
        f"{spec.checkpoint_dir}/{PurePosixPath(run_dir).name}"

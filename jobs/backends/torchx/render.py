"""The TorchX backend's renderer: a JobSpec -> a TorchX AppDef. Pure.

One role, ``nnodes`` replicas (``min_replicas`` = MIN for elastic jobs), each running the
same agent command as every other backend (``jobs.command``), through ``bash -c`` so that
the rendezvous host can be the scheduler's rank-0 host variable (TorchX's own ``dist.ddp``
does the same).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import shlex
from typing import Any

import yaml
from torchx import specs

from jobs.command import agent_command
from jobs.spec import JobSpec
from jobs.values import SpecError
from trainer.contract import omp_threads

ROLE = "trainer"


def rdzv_endpoint(spec: JobSpec) -> str:
    """``localhost:0`` (a free port) on one node; else rank 0's host, as TorchX exports it.
    ``$$`` survives TorchX's macro substitution as ``$`` for bash to expand."""
    if spec.nnodes.max == 1:
        return "localhost:0"
    return f"$${{{specs.macros.rank0_env}:=localhost}}:{spec.rdzv.port}"


def render_appdef(spec: JobSpec, *, extra_args: tuple[str, ...] = (), max_retries: int = 0,
                  named_resource: str | None = None, python: str = "python") -> specs.AppDef:
    """The AppDef that ``torchx run`` / ``torchjob submit --to torchx:SCHEDULER`` submits."""
    if spec.secrets:
        raise SpecError("secrets", "TorchX has no secret references: for local schedulers "
                        "put the variable in env, on Kubernetes use --to k8s")
    endpoint = rdzv_endpoint(spec)
    command = agent_command(spec, python=python, rdzv_endpoint=endpoint,
                            run_id=specs.macros.app_id, extra_args=extra_args)
    script = " ".join(arg if arg == endpoint else shlex.quote(arg) for arg in command)
    if named_resource:
        resource = specs.resource(h=named_resource)
    else:
        mem = spec.resources.memory.mib if spec.resources.memory else 1024 * spec.nproc_per_node
        resource = specs.Resource(cpu=math.ceil(spec.resources.cpu or spec.nproc_per_node),
                                  gpu=spec.resources.gpus, memMB=mem)
    mounts: list[specs.BindMount | specs.VolumeMount | specs.DeviceMount] = [
        specs.BindMount(src_path=m.source, dst_path=m.target, read_only=m.read_only)
        if m.source.startswith("/") else
        specs.VolumeMount(src=m.source, dst_path=m.target, read_only=m.read_only)
        for m in spec.mounts]
    role = specs.Role(
        name=ROLE, image=spec.image, entrypoint="bash", args=["-c", script],
        num_replicas=spec.nnodes.max, min_replicas=spec.nnodes.min, resource=resource,
        env={"OMP_NUM_THREADS": str(omp_threads(resource.cpu, spec.nproc_per_node)),
             "PYTHONUNBUFFERED": "1", **spec.env}, port_map={"c10d": spec.rdzv.port},
        max_retries=max_retries, mounts=mounts)
    return specs.AppDef(name=spec.name, roles=[role])


def appdef_text(app: specs.AppDef) -> str:
    """The AppDef as YAML (what ``torchjob render --to torchx`` prints)."""
    return yaml.safe_dump(_plain(app), sort_keys=False, width=100)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value

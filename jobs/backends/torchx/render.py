"""The TorchX backend's renderer: a JobSpec -> a TorchX AppDef. Pure.

One role of ``nnodes`` replicas (``min_replicas`` = MIN for elastic jobs), each running the
agent command of ``jobs.command`` through ``bash -c``, so that the rendezvous host can be the
scheduler's rank-0 host variable, as TorchX's ``dist.ddp`` does. Every user string is escaped
to arrive unchanged through TorchX's macros and the kubelet's ``$(VAR)`` (``literal``,
``shell_word``, ``kubelet``; docs/internals.md).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import shlex
from typing import Any

import yaml
from torchx import specs

from torchjob.jobs.command import agent_command, kubelet_literal
from torchjob.jobs.hosts import host_path, is_path, refuse_system_dir
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import SpecError
from torchjob.trainer.contract import thread_env
from torchjob.trainer.env import SLURM_PORTS

ROLE = "trainer"
# TorchX's Slurm scheduler: the rendezvous port --to slurm takes (trainer.env.slurm_port),
# worked out by bash on each node from the job id they share: two jobs whose first node is one
# host do not meet on one port, and it is never a port a local run picks (jobs.invocation)
SLURM_JOB_PORT = f"$$(({SLURM_PORTS.start} + SLURM_JOB_ID % {len(SLURM_PORTS)}))"


class Macro(str):
    """A word with TorchX macros in it, written by this module (the app id, rank 0's host):
    the one kind of word TorchX may expand."""


def literal(text: str) -> str:
    """``text`` as TorchX must receive it in ``Role.args`` or ``Role.env`` to pass ``text``
    itself on: its macro substitution (``string.Template.safe_substitute``) reads ``$$`` as
    ``$``, so every ``$`` is doubled."""
    return text.replace("$", "$$")


def shell_word(arg: str) -> str:
    """``arg`` quoted for bash, with no ``$`` followed by ``(`` or ``$`` (which the kubelet
    would expand): shlex puts every ``$`` inside a single-quoted segment, and ``'a$''(b)'``
    is ``a$(b)`` to bash."""
    return shlex.quote(arg).replace("$", "$''")


def rdzv_endpoint(spec: JobSpec, port: int | str) -> Macro:
    """``localhost:0`` (a free port) on one node; else rank 0's host, as TorchX exports it.
    ``$$`` survives TorchX's macro substitution as ``$`` for bash to expand."""
    if spec.nnodes.max == 1:
        return Macro("localhost:0")
    return Macro(f"$${{{specs.macros.rank0_env}:=localhost}}:{port}")


def bind_source(path: str, source: str, workdir: str | None) -> str | None:
    """The host path a mount's ``source`` binds (``/...``; ``./...`` under ``workdir``), never
    a system directory; None for a volume's name (TorchX's ``VolumeMount``)."""
    if not is_path(source):
        return None
    if workdir is None and not source.startswith("/"):
        raise SpecError(path, f"{source!r} is a path on this machine (relative to where "
                        "torchjob runs), and this scheduler's nodes do not see it: give the "
                        "directory's path on the nodes (/...), or a volume's name")
    refuse_system_dir(path, source, workdir)
    return host_path(workdir, source) if workdir is not None else source


def render_appdef(spec: JobSpec, *, extra_args: tuple[str, ...] = (), max_retries: int = 0,
                  named_resource: str | None = None, python: str = "python",
                  kubelet: bool = False, env_in_script: bool = False,
                  binds: tuple[tuple[str, str], ...] = (),
                  workdir: str | None = None, port: int | str | None = None,
                  ) -> specs.AppDef:
    """The AppDef that ``torchx run`` / ``torchjob submit --to torchx:SCHEDULER`` submits.
    ``kubelet``: for a Kubernetes scheduler, whose pods' command and env the kubelet expands
    too (``$(VAR)``), user strings are escaped for it as well. ``env_in_script``: the user's
    env as ``env NAME=VALUE`` words of the script, for a caller that does not know the
    scheduler. ``binds``: (host, container) directories mounted besides the spec's mounts
    (local_docker's run directory, ``torchjob.jobs.hosts.run_binds``). ``workdir``: where a
    relative mount source (``./data``) starts, as --to docker reads it; None: the nodes do not
    see this machine, and one is refused. ``port``: if not the spec's (or SLURM_JOB_PORT)."""
    port = spec.rdzv.port if port is None else port
    if spec.secrets:
        raise SpecError("secrets", "TorchX has no secret references: for local schedulers "
                        "put the variable in env, on Kubernetes use --to k8s")
    sources = [bind_source(f"mounts[{i}].source", m.source, workdir)
               for i, m in enumerate(spec.mounts)]
    endpoint = rdzv_endpoint(spec, port)
    command = agent_command(spec, python=python, rdzv_endpoint=endpoint,
                            run_id=Macro(specs.macros.app_id), extra_args=extra_args)

    def user(text: str) -> str:  # a user's string, for TorchX and then for the kubelet
        return literal(kubelet_literal(text) if kubelet else text)

    def word(arg: str) -> str:  # bash expands the endpoint; every other word is quoted
        if arg is endpoint:
            return arg
        return shlex.quote(arg) if isinstance(arg, Macro) else user(shell_word(arg))

    user_env = {} if env_in_script else {k: user(v) for k, v in spec.env.items()}
    if env_in_script and spec.env:
        command = ("env", *(f"{k}={v}" for k, v in spec.env.items()), *command)
    script = " ".join(word(arg) for arg in command)
    if named_resource:
        resource = specs.resource(h=named_resource)
    else:
        procs = spec.procs or 1  # a node that counts its own: one process asked for
        mem = spec.resources.memory.mib if spec.resources.memory else 1024 * procs
        resource = specs.Resource(cpu=math.ceil(spec.resources.cpu or procs),
                                  gpu=spec.resources.gpus, memMB=mem)
    mounts: list[specs.BindMount | specs.VolumeMount | specs.DeviceMount] = [
        specs.BindMount(src_path=source, dst_path=m.target, read_only=m.read_only)
        if source is not None else
        specs.VolumeMount(src=m.source, dst_path=m.target, read_only=m.read_only)
        for m, source in zip(spec.mounts, sources)]
    mounts += [specs.BindMount(src_path=source, dst_path=target) for source, target in binds]
    role = specs.Role(
        name=ROLE, image=spec.image, entrypoint="bash", args=["-c", script],
        num_replicas=spec.nnodes.max, min_replicas=spec.nnodes.min, resource=resource,
        env={**thread_env(resource.cpu, spec.procs),
             "PYTHONUNBUFFERED": "1", **user_env},
        port_map={"c10d": port if isinstance(port, int) else spec.rdzv.port},
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

"""The local backend's renderer: a JobSpec -> torchrun commands for this machine. Pure.

Each emulated node is one agent (``python -m torchjob.trainer.agent``); all meet at one c10d
rendezvous on 127.0.0.1, whose store, for an elastic job, is a process of its own
(``python -m torchjob.trainer.store``). Everything that varies between runs (port, run id,
interpreter, CPU count) is passed in; ``jobs.backends.local.nodes`` performs the result.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from torchjob.jobs.command import agent_command, own_store, store_command
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import FrozenMap
from torchjob.trainer.contract import thread_env


@dataclass(frozen=True)
class LocalPlan:
    """What ``torchjob run --to local`` starts: one argv per node, the env they share."""

    commands: tuple[tuple[str, ...], ...]
    env: Mapping[str, str]
    # Variables the caller's environment must provide (secrets: never in the plan itself).
    secrets: tuple[str, ...] = ()
    # The user's script (trainer.script), which must exist here before anything starts.
    script: str | None = None
    # nnodes MIN: the job finished when at least this many nodes did (an elastic job goes on
    # without a lost node)
    min_nodes: int = 1
    # The rendezvous store's argv (trainer.store) for an elastic job: started before the nodes.
    store: tuple[str, ...] | None = None


def render_local(spec: JobSpec, *, port: int, python: str, run_id: str,
                 cpu_count: int) -> LocalPlan:
    """The torchrun command of each local node and the environment they need."""
    nodes = spec.local_nodes
    command = agent_command(spec, python=python, rdzv_endpoint=f"127.0.0.1:{port}",
                            run_id=run_id, store_client=own_store(spec),
                            gives_gpus=False)  # resources.gpus: nothing to ask for here
    env = {
        # the machine's CPUs shared by the emulated nodes, then by each node's workers
        **thread_env(cpu_count / nodes, spec.procs),
        "PYTHONUNBUFFERED": "1",
        **spec.env,
    }
    store = store_command(spec, python=python, port=port) if own_store(spec) else None
    return LocalPlan(commands=(command,) * nodes, env=FrozenMap(env),
                     secrets=tuple(ref.env for ref in spec.secrets), script=spec.trainer.script,
                     min_nodes=spec.nnodes.min, store=store)


def render_text(plan: LocalPlan) -> str:
    """The plan as shell lines (what ``torchjob render --to local`` prints), quoted with shlex."""
    prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in plan.env.items())
    lines = [f"# secrets read from your environment: {' '.join(plan.secrets)}"] \
        if plan.secrets else []
    many = len(plan.commands) > 1 or plan.store is not None
    if plan.store is not None:
        lines.append(f"{shlex.join(plan.store)} &  # the rendezvous store; no node hosts it")
    for command in plan.commands:
        line = f"{prefix} {shlex.join(command)}" if prefix else shlex.join(command)
        lines.append(f"{line} &" if many else line)
    if plan.store is not None:  # the store (job %1) serves until the nodes have ended
        nodes = " ".join(f"%{i + 2}" for i in range(len(plan.commands)))
        lines.append(f"wait {nodes}; kill %1")
    elif many:
        lines.append("wait")
    return "\n".join(lines) + "\n"

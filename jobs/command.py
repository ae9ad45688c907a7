"""The one command every node of every backend runs: the trainer's elastic agent. Pure.

``python -m trainer.agent`` takes torchrun's arguments; this builds them from the JobSpec so
that the topology, rendezvous, restarts and trainer arguments are stated in one place.
Backends differ only in the interpreter, the rendezvous endpoint and the run id they pass.
"""

from __future__ import annotations

from jobs.spec import JobSpec, trainer_argv


def agent_command(spec: JobSpec, *, python: str, rdzv_endpoint: str, run_id: str,
                  extra_args: tuple[str, ...] = ()) -> tuple[str, ...]:
    """argv of one node's agent: c10d rendezvous at ``rdzv_endpoint``, then the trainer
    (``-m MODULE`` or a script) and its arguments."""
    rdzv_conf = (f"join_timeout={spec.rdzv.join_timeout},"
                 f"last_call_timeout={spec.rdzv.last_call_timeout}")
    return (
        python, "-m", "trainer.agent",
        *(["--retry-on-error"] if spec.retry_on_error else []),
        "--nnodes", str(spec.nnodes),
        "--nproc-per-node", str(spec.nproc_per_node),
        "--rdzv-backend", spec.rdzv.backend,
        "--rdzv-endpoint", rdzv_endpoint,
        "--rdzv-id", run_id,
        "--rdzv-conf", rdzv_conf,
        "--max-restarts", str(spec.max_restarts),
        "--monitor-interval", "0.1",
        *spec.trainer.entry,
        "--run-dir", spec.run_dir,
        "--checkpoint-dir", spec.checkpoint_dir,
        *trainer_argv(spec.trainer.args),
        *extra_args,
    )

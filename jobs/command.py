"""The one command every node of every backend runs: the trainer's elastic agent. Pure.

It states a JobSpec's topology, rendezvous, restarts and trainer arguments in one place;
backends pass only the interpreter, the rendezvous endpoint and the run id. An elastic job's
agents are clients of a store of its own (``own_store``, ``store_command``). A user's script
gets exactly its ``trainer.args``; the built-in trainer ``--run-dir`` and ``--checkpoint-dir`` too.
"""

from __future__ import annotations

from torchjob.jobs.spec import JobSpec
from torchjob.jobs.trainer_args import trainer_argv
from torchjob.trainer.contract import (CHECKPOINT_BUDGET_OPTION, CHECKPOINT_BUDGET_S,
                                       CHECKPOINT_DIR_OPTION, COLLECTIVE_TIMEOUT_OPTION,
                                       COLLECTIVE_TIMEOUT_S, EXPECT_GPUS_OPTION,
                                       HANG_TIMEOUT_OPTION,
                                       MAX_STALLED_DEFAULT, MAX_STALLED_OPTION, RESUME_OPTION,
                                       RUN_DIR_OPTION)


def kubelet_literal(text: str) -> str:
    """``text`` as the kubelet must receive it to start the container with ``text`` itself: it
    expands ``$(VAR)`` in a container's command, args and env values and reads ``$$`` as
    ``$``, so every ``$`` is doubled (``$(HOME)`` -> ``$$(HOME)``). For every renderer that
    writes a pod's command or env (Kubernetes, TorchX's Kubernetes scheduler), once."""
    return text.replace("$", "$$")


def dir_options(spec: JobSpec) -> tuple[str, ...]:
    """The agent's options that tell every worker the run's directories (``TORCHJOB_RUN_DIR``,
    ``TORCHJOB_CHECKPOINT_DIR``)."""
    return (RUN_DIR_OPTION, spec.run_dir, CHECKPOINT_DIR_OPTION, spec.checkpoint_dir)


def entry_args(spec: JobSpec) -> tuple[str, ...]:
    """What follows the entry (``-m MODULE`` or the script): ``trainer.args``, after the
    built-in trainer's ``--run-dir`` and ``--checkpoint-dir`` and its metrics exporters (only
    those set: a spec without them renders as before)."""
    own = ("--run-dir", spec.run_dir, "--checkpoint-dir", spec.checkpoint_dir,
           *export_options(spec)) if spec.trainer.builtin else ()
    return (*own, *trainer_argv(spec.trainer.args))


def export_options(spec: JobSpec) -> tuple[str, ...]:
    """The built-in trainer's ``--tensorboard``, ``--prometheus-dir`` and ``--exporters``, where
    the spec sets them."""
    return (*(["--tensorboard", "true"] if spec.tensorboard else []),
            *(["--prometheus-dir", spec.prometheus_dir] if spec.prometheus_dir else []),
            *(["--exporters", ",".join(spec.exporters)] if spec.exporters else []))


def own_store(spec: JobSpec) -> bool:
    """Whether the job's rendezvous store runs as a process of its own that no node hosts: for
    elastic jobs (``nnodes: MIN:MAX``), which must outlive the loss of any one node. A fixed-size
    job cannot go on without every node anyway, so its first node's agent hosts the store (as
    torchrun does) and no extra process or service is started for it."""
    return spec.nnodes.is_elastic


STORE_MODULE = "torchjob.trainer.store"


def store_command(spec: JobSpec, *, python: str, port: int | str | None = None
                  ) -> tuple[str, ...]:
    """argv of the job's own rendezvous store (``torchjob.trainer.store``), on ``port`` (default
    ``rdzv.port``)."""
    word = port if isinstance(port, str) else str(spec.rdzv.port if port is None else port)
    return (python, "-m", STORE_MODULE, "--port", word)  # a str (a shell word) stays as it is


def timeout_options(spec: JobSpec) -> tuple[str, ...]:
    """The agent's options for the workers' collective timeout and checkpoint budget, where
    they differ from the defaults the agent and the trainer share (torchjob.jobs.timeouts)."""
    out: list[str] = []
    for option, value, default in ((COLLECTIVE_TIMEOUT_OPTION, spec.collective_timeout,
                                    COLLECTIVE_TIMEOUT_S),
                                   (CHECKPOINT_BUDGET_OPTION, spec.checkpoint_budget,
                                    CHECKPOINT_BUDGET_S)):
        if value != default:
            out += [option, f"{value:g}"]
    return tuple(out)


def agent_command(spec: JobSpec, *, python: str, rdzv_endpoint: str, run_id: str,
                  extra_args: tuple[str, ...] = (), store_client: bool = False,
                  gives_gpus: bool = True) -> tuple[str, ...]:
    """argv of one node's agent: c10d rendezvous at ``rdzv_endpoint``, then the trainer
    (``-m MODULE`` or a script) and its arguments. With ``store_client`` (a backend that runs
    the job's own store, ``own_store``) no agent hosts the store (``is_host=false``: torch
    would otherwise let the agent whose host name matches the endpoint serve it), even on the
    store's own host. ``gives_gpus``: the backend asks for ``resources.gpus`` (all but local),
    so each agent checks that its node sees them (``--expect-gpus``)."""
    rdzv_conf = (f"join_timeout={spec.rdzv.join_timeout},"
                 f"last_call_timeout={spec.rdzv.last_call_timeout}"
                 + (",is_host=false" if store_client else ""))
    return (
        python, "-m", "torchjob.trainer.agent",
        *dir_options(spec),
        *(["--retry-on-error"] if spec.retry_on_error else []),
        *([RESUME_OPTION, spec.resume] if spec.resume != "auto" else []),
        *([MAX_STALLED_OPTION, str(spec.max_stalled_restarts)]
          if spec.max_stalled_restarts != MAX_STALLED_DEFAULT else []),
        HANG_TIMEOUT_OPTION, f"{spec.hang_timeout:g}",
        *timeout_options(spec),
        *([EXPECT_GPUS_OPTION, str(spec.resources.gpus)]
          if gives_gpus and spec.resources.gpus else []),
        "--nnodes", str(spec.nnodes),
        "--nproc-per-node", str(spec.nproc_per_node),
        "--rdzv-backend", spec.rdzv.backend,
        "--rdzv-endpoint", rdzv_endpoint,
        "--rdzv-id", run_id,
        "--rdzv-conf", rdzv_conf,
        "--max-restarts", str(spec.max_restarts),
        "--monitor-interval", "0.1",
        *spec.trainer.entry,
        *own_words((*entry_args(spec), *extra_args)),
    )


def own_words(words: tuple[str, ...]) -> tuple[str, ...]:
    """The entry's arguments as the agent's parser (torchrun's) gives them back: it takes a
    ``--`` right after the script or module for its own, so one that is the first word goes
    behind a ``--`` of ours (as torchrun passes ``s.py -- --`` the script ``['--']``)."""
    return ("--", *words) if words[:1] == ("--",) else words

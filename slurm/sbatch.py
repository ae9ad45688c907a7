"""The sbatch renderer: a JobSpec -> a standalone batch script a user submits with ``sbatch``. Pure.

One ``srun`` task per node runs the torchrun agent (``python -m trainer.agent``); the agents meet
at a c10d rendezvous on the allocation's first node, on the port ``trainer.env.slurm_port``
derives from the job id. Everything that varies (interpreter, working directory) is passed in,
so the text is deterministic and golden-tested whole.

Stopping (time limit or ``scancel --batch --signal=USR2``) goes batch shell -> per-node wrapper
-> agent -> workers, one signal per process; see ``STOP_NOTES`` in the script for why.

A lost node: each wrapper writes its agent's exit code to a status directory in the run dir; a
node that never wrote one was lost. An elastic job whose other agents finished (torchrun
restarted them at the smaller size) then ends 0, and the script says which nodes were lost
and that it carried on; a fixed-size job fails, saying why. Worker lines carry ``[attempt A
rank R]: `` (torchrun's ``--tee``) for ``torchjob logs`` (``slurm.slurm_logs``).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable

from jobs.command import agent_command as shared_agent_command
from jobs.spec import JobSpec


class Raw(str):
    """A word that reaches the script unquoted: a shell expansion written by this module only."""


# The script's stop path, as comments in the script itself.
STOP_NOTES = """\
# Stopping: exit code 143 means "stopped: a checkpoint was written, run again to continue".
# --signal=B:USR2@N sends USR2 to this batch shell only. A signal sent to a job step reaches
# EVERY process of the step (agent and workers alike), so a step-wide USR2 or TERM would hit
# each worker twice: once from Slurm, once forwarded by torchrun's agent, and the trainer
# treats a second stop signal as "exit now, without a checkpoint". Instead this shell sends
# the step SIGURG, which every process ignores by default except the per-node wrapper below;
# the wrapper sends TERM to its agent alone, the agent forwards it once to its workers, they
# finish the step, checkpoint and exit 143, and this shell requeues the job (bounded by
# SLURM_RESTART_COUNT). A requeue or preemption by Slurm itself (SIGTERM to every process)
# still stops the workers, without the final checkpoint: the run resumes from the last
# periodic one."""

# The per-node wrapper: starts the agent ("$@"), turns the step's URG into one TERM to the
# agent, and reports 143 when the stop it forwarded ended the agent with a failure.
WRAPPER = """\
"$@" & agent=$!
stopping=0 pending=0
trap 'stopping=1 pending=1; kill -TERM "$agent" 2>/dev/null || true' URG
code=0; wait "$agent" || code=$?
while [ "$code" -gt 128 ] && [ "$pending" = 1 ]; do  # the URG trap cut wait short
  pending=0; next=0; wait "$agent" || next=$?
  [ "$next" = 127 ] || code=$next  # 127: the agent had already been collected
done
# torchrun's agent exits 1 after a forwarded stop; its workers exited 143 after a checkpoint
if [ "$stopping" = 1 ] && [ "$code" != 0 ]; then code=143; fi
# report how this node ended; a node that never reports was lost (killed, or the node failed)
echo "$code" > "$TORCHJOB_NODE_STATUS/${SLURMD_NODENAME:-$(hostname)}" 2>/dev/null || true
exit "$code"
"""


def sbatch_value(value: str, what: str) -> str:
    """A value for an ``#SBATCH`` line: sbatch splits on blanks and strips double quotes. A
    newline would end the comment and let bash run the rest, so it is refused."""
    if any(not c.isprintable() for c in value):
        raise ValueError(f"{what} {value!r} contains a newline or control character: it cannot "
                         "be written on an #SBATCH line")
    if any(c.isspace() for c in value) or '"' in value or not value:
        if '"' in value:
            raise ValueError(f"{what} {value!r} contains '\"', which #SBATCH lines cannot quote")
        return f'"{value}"'
    return value


def quote(words: Iterable[str]) -> str:
    """Shell words: each quoted with shlex, except ``Raw`` expansions this module wrote."""
    return " ".join(w if isinstance(w, Raw) else shlex.quote(w) for w in words)


def cpus_per_node(spec: JobSpec) -> int:
    """``--cpus-per-task`` of the one task per node: resources.cpu (rounded up), else one CPU
    per worker process."""
    cpu = spec.resources.cpu
    return -int(-cpu // 1) if cpu is not None else spec.nproc_per_node


def directives(spec: JobSpec, *, workdir: str) -> list[str]:
    """The ``#SBATCH`` options, in a fixed order."""
    s = spec.slurm
    run_dir = posixpath.join(workdir, spec.run_dir)  # Slurm opens these before the script runs
    nodes = str(spec.nnodes.min) if not spec.nnodes.is_elastic \
        else f"{spec.nnodes.min}-{spec.nnodes.max}"
    # a node range with --ntasks-per-node gets MIN nodes (the task count follows MIN); without
    # it, Slurm gives as many nodes as are free, up to MAX (srun below sets the tasks)
    per_node = [] if spec.nnodes.is_elastic else ["--ntasks-per-node=1"]
    opts = [f"--job-name={spec.name}", f"--nodes={nodes}", *per_node,
            f"--cpus-per-task={cpus_per_node(spec)}"]
    if spec.resources.memory is not None:
        opts.append(f"--mem={spec.resources.memory.mib}M")
    if spec.resources.gpus:
        opts.append(f"--gpus-per-node={spec.resources.gpus}")
    for flag, value in (("time", s.time), ("partition", s.partition), ("account", s.account),
                        ("qos", s.qos), ("constraint", s.constraint)):
        if value is not None:
            opts.append(f"--{flag}={sbatch_value(value, 'slurm.' + flag)}")
    if s.exclusive:
        opts.append("--exclusive")
    if s.signal_delay:
        opts.append(f"--signal=B:USR2@{s.signal_delay}")
    if spec.nnodes.is_elastic:
        opts.append("--no-kill")  # losing a node ends its srun task, not the job (down to MIN)
    opts += ["--requeue", "--open-mode=append",
             f"--output={sbatch_value(run_dir + '/slurm-%j.out', 'run_dir')}",
             f"--error={sbatch_value(run_dir + '/slurm-%j.err', 'run_dir')}"]
    opts += [sbatch_value(flag, "slurm.extra_flags") for flag in s.extra_flags]
    return [f"#SBATCH {opt}" for opt in opts]


def environment(spec: JobSpec) -> dict[str, str]:
    """What every process on every node sees: defaults first, the spec's env overrides them."""
    env = {"OMP_NUM_THREADS": str(max(1, cpus_per_node(spec) // spec.nproc_per_node)),
           "PYTHONUNBUFFERED": "1"}
    if spec.resources.gpus:  # a hung collective raises instead of blocking until the time limit
        env |= {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"}
    return env | dict(spec.env)


def agent_command(spec: JobSpec, *, python: str) -> list[str]:
    """The shared agent command, with the rendezvous on the first node's job port."""
    return list(shared_agent_command(spec, python=python,
                                     rdzv_endpoint=Raw('"$rdzv_host:$port"'),
                                     run_id=Raw('"$SLURM_JOB_ID"')))


def _mounts(spec: JobSpec) -> list[str]:
    return [f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in spec.mounts]


def srun_command(spec: JobSpec, *, python: str, workdir: str) -> list[str]:
    """``srun`` with one task per node: the wrapper, in the container when one is set."""
    s = spec.slurm
    image = s.container_image or spec.image
    srun = ["srun", "--kill-on-bad-exit=0", Raw('--nodes="$SLURM_JOB_NUM_NODES"'),
            Raw('--ntasks="$SLURM_JOB_NUM_NODES"'), "--ntasks-per-node=1",
            f"--cpus-per-task={cpus_per_node(spec)}"]  # 22.05's srun does not inherit it
    prefix: list[str] = []
    if s.container == "pyxis":
        srun += [f"--container-image={image}", f"--container-workdir={workdir}"]
        if spec.mounts:
            srun.append(f"--container-mounts={','.join(_mounts(spec))}")
    elif s.container == "apptainer":
        prefix = ["apptainer", "exec", *(["--nv"] if spec.resources.gpus else []),
                  *(f"--bind={m}" for m in _mounts(spec)), f"--pwd={workdir}", image]
    return [*srun, "bash", "-c", Raw('"$node"'), "torchjob-node", *prefix,
            *agent_command(spec, python=python)]


def lost_nodes(spec: JobSpec) -> list[str]:
    """After a failed step: name the nodes whose task never reported (lost), and say whether
    the job carried on without them (elastic, some node finished) or had to fail."""
    nnodes = spec.nnodes
    out = ['# a failed step: which nodes never reported how their agent ended (lost: killed, or '
           'the node failed)?',
           'if [ "$code" != 0 ] && [ "$stop" = 0 ]; then',
           '  lost="" finished=0',
           '  for host in $hosts; do',
           '    if [ ! -f "$TORCHJOB_NODE_STATUS/$host" ]; then lost="$lost $host"',
           '    elif [ "$(cat "$TORCHJOB_NODE_STATUS/$host")" = 0 ]; then finished=1; fi',
           '  done',
           '  if [ -n "$lost" ]; then',
           '    echo "torchjob: lost node(s):$lost: the task there ended without reporting '
           '(killed, or the node failed); step exit $code" >&2']
    if nnodes.is_elastic:
        out += [
           '    if [ "$finished" = 1 ]; then',
           f'      echo "torchjob: the job continued without them at a smaller size (nnodes '
           f'{nnodes}: at least {nnodes.min}) and finished"',
           '      code=0',
           '    else',
           '      echo "torchjob: the remaining node(s) did not finish either: failed" >&2',
           '    fi']
    else:
        out += [
           f'    echo "torchjob: nnodes is {nnodes} (fixed): the job cannot continue without '
           f'every node, so it failed (the other agents gave up after rdzv.join_timeout='
           f'{spec.rdzv.join_timeout}s or max_restarts={spec.max_restarts}). Submit again to '
           'resume from the last checkpoint, or use nnodes MIN:MAX to carry on with fewer '
           'nodes" >&2']
    return out + ['  fi', 'fi']


def render_sbatch(spec: JobSpec, *, python: str, workdir: str) -> str:
    """The whole batch script: ``#SBATCH`` options, then a body that runs, stops and requeues.

    ``python`` is the interpreter on the nodes (inside the image when slurm.container is set);
    ``workdir`` is the absolute directory the job runs in (relative run_dir/checkpoint_dir are
    under it)."""
    sbatch_value(workdir, "workdir")
    if not workdir.startswith("/"):
        raise ValueError(f"workdir {workdir!r} must be an absolute path")
    s = spec.slurm
    head = ["#!/bin/bash",
            f"# torchjob: {spec.name} on Slurm. Create the run directory first (Slurm does not):",
            f"#   mkdir -p {shlex.quote(posixpath.join(workdir, spec.run_dir))} && sbatch THIS",
            *directives(spec, workdir=workdir)]
    if spec.secrets:
        head.append("# secrets read from your environment (sbatch exports it): "
                    + " ".join(ref.env for ref in spec.secrets))
    body = [
        "set -euo pipefail",
        f"cd {shlex.quote(workdir)}",
        *(f"export {key}={shlex.quote(value)}" for key, value in environment(spec).items()),
        "",
        "# rendezvous: the first node of the allocation, on a port derived from the job id",
        "# (trainer.env.slurm_port: 12000 + id % 20000, so two jobs on a node do not collide)",
        '# (no "| head -n1": with pipefail, scontrol dying of SIGPIPE would end the script)',
        'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "rdzv_host=${hosts%%$'\\n'*}",
        "port=$((12000 + SLURM_JOB_ID % 20000))",
        'attempt=${SLURM_RESTART_COUNT:-0}',
        "# each worker's lines carry \"[attempt A rank R]: \" (torchrun's --tee with a line "
        "prefix), so that",
        "# `torchjob logs --to slurm JOB_ID` can show them per attempt and per rank",
        "export PET_TEE=3 TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=\"[attempt $attempt rank "
        "\\${rank}]: \"",
        "# each node's wrapper writes its exit code here (on the shared file system)",
        "export TORCHJOB_NODE_STATUS="
        + shlex.quote(posixpath.join(workdir, spec.run_dir, ".torchjob-nodes"))
        + '/"$SLURM_JOB_ID.$attempt"',
        'mkdir -p "$TORCHJOB_NODE_STATUS"',
        f'header="torchjob: {spec.name} job $SLURM_JOB_ID attempt $attempt on '
        '$SLURM_JOB_NUM_NODES node(s), rendezvous $rdzv_host:$port"',
        'echo "$header"; echo "$header" >&2  # where this attempt starts, in both logs',
        "",
        STOP_NOTES,
        "stop=0 pending=0",
        "trap 'stop=1 pending=1; echo \"torchjob: USR2: asking the training step to checkpoint "
        "and stop\"; scancel --signal=URG \"$SLURM_JOB_ID\" || true' USR2",
        "",
        "# one task per node: this wrapper around the agent (a constant; it takes the agent's "
        "command as \"$@\")",
        "read -r -d '' node <<'NODE' || true",
        WRAPPER + "NODE",
        quote(srun_command(spec, python=python, workdir=workdir)) + " &",
        "step=$!",
        'code=0; wait "$step" || code=$?',
        'while [ "$code" -gt 128 ] && [ "$pending" = 1 ]; do  # the USR2 trap cut wait short',
        '  pending=0; next=0; wait "$step" || next=$?',
        '  [ "$next" = 127 ] || code=$next  # 127: the step had already been collected',
        "done",
        *lost_nodes(spec),
        '# read; the next attempt writes its own',
        'rm -rf "$TORCHJOB_NODE_STATUS"; rmdir "${TORCHJOB_NODE_STATUS%/*}" 2>/dev/null || true',
        "# 0: done; 143: stopped after a checkpoint (requeue); anything else: a failure",
        'if [ "$stop" = 0 ] || [ "$code" != 143 ]; then exit "$code"; fi',
        f'if [ "$attempt" -lt {s.max_requeues} ]; then',
        f'  echo "torchjob: stopped (step exit $code); requeueing, attempt $((attempt + 1)) of '
        f'{s.max_requeues} requeues"',
        '  scontrol requeue "$SLURM_JOB_ID" || echo "torchjob: scontrol requeue failed: submit '
        'the script again to continue" >&2',
        "  exit 143  # Slurm ends this attempt; the requeued one resumes from the checkpoint",
        "fi",
        f'echo "torchjob: stopped after {s.max_requeues} requeues (slurm.max_requeues): the '
        'checkpoint is in place; submit the script again to continue" >&2',
        "exit 143",
    ]
    return "\n".join(head + [""] + body) + "\n"


"""The sbatch renderer: a JobSpec -> the batch script that ``render --to slurm`` prints and that
both Slurm backends (submitit, plain sbatch) submit unchanged. Pure.

One ``srun`` task per node runs the agent; they meet at a c10d rendezvous on the first node
(port ``trainer.env.slurm_port``), whose store, for an elastic job, is a process of the batch
shell (``store_block``). The shell is ``job.sh``, its ``@name@`` placeholders filled with
values quoted here; a sweep is a job array. Why so: docs/internals.md.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping
from importlib import resources

from torchjob.jobs.command import agent_command as shared_agent_command
from torchjob.jobs.command import dir_options, entry_args, own_store, store_command
from torchjob.jobs.hosts import refuse_system_dirs
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.sweep import Sweep, sweep_specs
from torchjob.trainer.contract import thread_env

TEMPLATE = resources.files(__package__ or "slurm").joinpath("job.sh").read_text(encoding="utf-8")
PLACEHOLDER = re.compile(r"@([a-z_]+)@")
COMMENT = "torchjob"  # every job's --comment: what `torchjob list` looks for


class Raw(str):
    """A word that reaches the script unquoted: a shell expansion written by this module only."""


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
    """Shell words: each quoted with shlex, except ``Raw`` expansions this module wrote. A
    word with a comma is quoted too: in an array, ``(a,b)`` reads as a mistake (SC2054)."""
    def one(word: str) -> str:
        quoted = shlex.quote(word)
        return f"'{word}'" if quoted == word and "," in word else quoted

    return " ".join(w if isinstance(w, Raw) else one(w) for w in words)


def fill(template: str, values: Mapping[str, str]) -> str:
    """``@name@`` -> ``values[name]``, already quoted for the shell. A placeholder alone on its
    line takes a block of lines (none: the line goes). Every placeholder and every value must
    be used: a typo fails here, not on a cluster."""
    used: set[str] = set()

    def one(match: re.Match[str]) -> str:
        used.add(match[1])
        return values[match[1]]

    out: list[str] = []
    # split at "\n" only: str.splitlines also cuts at "\r", "\x0b", "\u2028", ... inside a
    # quoted value (export A=$'\r' would become two lines)
    for line in template.removesuffix("\n").split("\n"):
        alone = PLACEHOLDER.fullmatch(line.strip())
        if alone:
            used.add(alone[1])
            out += values[alone[1]].split("\n") if values[alone[1]] else []
        else:
            out.append(PLACEHOLDER.sub(one, line))
    if set(values) - used:
        raise ValueError(f"values not in the template: {sorted(set(values) - used)}")
    return "\n".join(out) + "\n"


def cpus_per_node(spec: JobSpec) -> int:
    """``--cpus-per-task`` of the one task per node: resources.cpu (rounded up), else one CPU
    per worker process (one in all where each node counts its own: ``cpu`` then means one)."""
    cpu = spec.resources.cpu
    return -int(-cpu // 1) if cpu is not None else spec.procs or 1


def directives(spec: JobSpec, *, workdir: str, array: int = 0) -> list[str]:
    """The ``#SBATCH`` options, in a fixed order; ``array``: the number of sweep points."""
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
    log = "slurm-%A_%a" if array else "slurm-%j"  # an array task's %j is its own id
    if array:
        opts.append(f"--array=0-{array - 1}")
    # --chdir: the run directory is where `torchjob logs` finds the logs (sacct's WorkDir);
    # the script goes to the working directory at once. --comment: `torchjob list` finds it.
    # in --output and --error Slurm expands %j, %u, ...: a '%' of the run directory is '%%'
    logs = run_dir.replace("%", "%%")
    opts += ["--requeue", "--open-mode=append", f"--chdir={sbatch_value(run_dir, 'run_dir')}",
             f"--comment={COMMENT}",
             f"--output={sbatch_value(f'{logs}/{log}.out', 'run_dir')}",
             f"--error={sbatch_value(f'{logs}/{log}.err', 'run_dir')}"]
    opts += [sbatch_value(flag, "slurm.extra_flags") for flag in s.extra_flags]
    return [f"#SBATCH {opt}" for opt in opts]


def environment(spec: JobSpec) -> dict[str, str]:
    """What every process on every node sees: defaults first, the spec's env overrides them."""
    env = {**thread_env(cpus_per_node(spec), spec.procs),
           "PYTHONUNBUFFERED": "1"}
    if spec.resources.gpus:  # a hung collective raises instead of blocking until the time limit
        env |= {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"}
    return env | dict(spec.env)


def agent_command(spec: JobSpec, *, python: str) -> list[str]:
    """The shared agent command, with the rendezvous on the first node's job port."""
    return list(shared_agent_command(spec, python=python,
                                     rdzv_endpoint=Raw('"$rdzv_host:$port"'),
                                     run_id=Raw('"$SLURM_JOB_ID"'),
                                     store_client=own_store(spec)))


def _mounts(spec: JobSpec) -> list[str]:
    return [f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in spec.mounts]


def srun_options(spec: JobSpec, *, workdir: str) -> list[str]:
    """``srun``'s options: one task per node, in the pyxis container when one is set."""
    srun = ["--kill-on-bad-exit=0", Raw('--nodes="$SLURM_JOB_NUM_NODES"'),
            Raw('--ntasks="$SLURM_JOB_NUM_NODES"'), "--ntasks-per-node=1",
            f"--cpus-per-task={cpus_per_node(spec)}"]  # 22.05's srun does not inherit it
    if spec.slurm.container == "pyxis":
        srun += [f"--container-image={spec.slurm.container_image or spec.image}",
                 f"--container-workdir={workdir}"]
        # a script or module comes from the submit directory (shared by the nodes), mounted
        # where it is; apptainer binds the working directory by itself
        mounts = _mounts(spec) + ([] if spec.trainer.builtin else [f"{workdir}:{workdir}"])
        if mounts:
            srun.append(f"--container-mounts={','.join(mounts)}")
    return srun


def node_command(spec: JobSpec, *, python: str, workdir: str, swept: bool = False) -> list[str]:
    """What the wrapper runs on each node: the agent, inside apptainer when set; a sweep's
    agent takes the point's words from ``$point``."""
    prefix: list[str] = []
    if spec.slurm.container == "apptainer":
        prefix = ["apptainer", "exec", *(["--nv"] if spec.resources.gpus else []),
                  *(f"--bind={m}" for m in _mounts(spec)), f"--pwd={workdir}",
                  spec.slurm.container_image or spec.image]
    agent = agent_command(spec, python=python)
    if swept:  # the words a sweep point changes: the run's directories, the trainer's arguments
        dirs, tail = list(dir_options(spec)), list(entry_args(spec))
        head, end = agent[:3 + len(dirs)], len(agent) - len(tail)
        assert head[3:] == dirs and agent[end:] == tail, \
            ("torchjob.jobs.command.agent_command: python -m torchjob.trainer.agent DIR_OPTIONS "
             "... ENTRY_ARGS")
        agent = [*head[:3], Raw('"${dirs[@]}"'), *agent[len(head):end], Raw('"${point[@]}"')]
    return [*prefix, *agent]


def store_block(spec: JobSpec, *, python: str, workdir: str) -> str:
    """The lines that start an elastic job's rendezvous store in the batch shell (``$store``:
    its pid, stopped once the step has ended); none for a fixed-size job. With pyxis, whose
    image only ``srun`` can enter, it is a one-task step on the first node that shares the
    training step's resources (``--overlap``)."""
    if not own_store(spec):
        return ""
    prefix: list[str] = []
    if spec.slurm.container == "apptainer":
        prefix = [w for w in node_command(spec, python=python, workdir=workdir)[:-len(
            agent_command(spec, python=python))] if w != "--nv"]  # no GPU for the store
    elif spec.slurm.container == "pyxis":
        prefix = ["srun", "--overlap", "--nodes=1", "--ntasks=1",
                  Raw('--nodelist="$rdzv_host"'),
                  *(w for w in srun_options(spec, workdir=workdir) if w.startswith("--container"))]
    command = [*prefix, *store_command(spec, python=python, port=Raw('"$port"'))]
    return "\n".join([
        "# the rendezvous store of this elastic job, served by this batch shell on the first",
        "# node and by no training task: losing any node's task leaves it (losing the batch",
        "# host ends the whole job in Slurm anyway); stopped once the training step has ended",
        f"{quote(command)} &",
        "store=$!"])


# the line each task of a sweep's array writes first to its output: its point's run directory,
# RUN_DIR/LABEL, is where torchjob status finds the task's progress (slurm.backend)
SWEEP_POINT_LINE = "torchjob: sweep point "


def point_block(points: list[JobSpec]) -> str:
    """The shell that picks a sweep point by ``SLURM_ARRAY_TASK_ID``: its run directory (named
    after the point: ``RUN_DIR/lr=1e-3``) for the agent, and its trainer arguments."""
    last = len(points) - 1
    lines = ["", "# the sweep: array task N runs point N, in its own run directory",
             'case "${SLURM_ARRAY_TASK_ID:-}" in']
    for i, spec in enumerate(points):
        lines += [f"  {i}) label={shlex.quote(posixpath.basename(spec.run_dir))}",
                  f"     dirs=({quote(dir_options(spec))})",
                  f"     point=({quote(entry_args(spec))}) ;;"]
    lines += ['  *) echo "torchjob: this script is a job array of sweep points 0-' f'{last}; '
              'SLURM_ARRAY_TASK_ID is \'${SLURM_ARRAY_TASK_ID:-}\'" >&2; exit 2 ;;',
              "esac",
              f'echo "{SWEEP_POINT_LINE}$SLURM_ARRAY_TASK_ID: $label"']
    return "\n".join(lines)


def render_sbatch(spec: JobSpec, *, python: str, workdir: str, sweep: Sweep | None = None) -> str:
    """The whole batch script: ``#SBATCH`` options, then the body of ``job.sh`` with this
    job's values; with ``sweep``, a job array of its points.

    ``python`` is the interpreter on the nodes (inside the image when slurm.container is set);
    ``workdir`` is the absolute directory the job runs in (relative run_dir/checkpoint_dir are
    under it)."""
    sbatch_value(workdir, "workdir")
    if not workdir.startswith("/"):
        raise ValueError(f"workdir {workdir!r} must be an absolute path")
    if spec.slurm.container != "none":  # pyxis and apptainer bind-mount spec.mounts
        refuse_system_dirs(spec, workdir=workdir, run_dirs=False)
    points = sweep_specs(spec, sweep) if sweep else []
    head = directives(spec, workdir=workdir, array=len(points))
    if spec.secrets:
        head.append("# secrets read from your environment (sbatch exports it): "
                    + " ".join(ref.env for ref in spec.secrets))
    run_dir = posixpath.join(workdir, spec.run_dir)
    values = {
        "name": shlex.quote(spec.name),
        "run_dir": shlex.quote(run_dir),
        "directives": "\n".join(head),
        "nnodes": shlex.quote(str(spec.nnodes)),
        "min_nodes": str(spec.nnodes.min),
        "elastic": "1" if spec.nnodes.is_elastic else "0",
        "join_timeout": str(spec.rdzv.join_timeout),
        "max_restarts": str(spec.max_restarts),
        "max_requeues": str(spec.slurm.max_requeues),
        "workdir": shlex.quote(workdir),
        "exports": "\n".join(f"export {key}={shlex.quote(value)}"
                             for key, value in environment(spec).items()),
        "node_status": shlex.quote(posixpath.join(run_dir, ".torchjob-nodes")),
        "point": point_block(points) if points else "",
        "store": store_block(spec, python=python, workdir=workdir),
        "srun_options": quote(srun_options(spec, workdir=workdir)),
        "agent": quote(node_command(spec, python=python, workdir=workdir, swept=bool(points))),
    }
    return fill(TEMPLATE, values)

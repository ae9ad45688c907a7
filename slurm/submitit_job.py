"""``torchjob submit --to slurm``: the job spec through submitit, with checkpoint and requeue.

One Slurm task per rank (``nproc_per_node`` tasks on each of ``nnodes`` nodes) runs
``TrainTask``, which calls the trainer in-process; the trainer reads SLURM_PROCID/LOCALID,
the step's task count, the first host and a port derived from the job id (no torchrun).

Requeue: Slurm sends SIGUSR2 ``slurm.signal_delay`` seconds before the time limit (or on
preemption, or ``scancel --signal=USR2 JOB``) to every task. While the trainer runs, its own
handler owns SIGUSR2: every rank finishes the step, the checkpoint is written and ``main``
returns 143, restoring submitit's handler. Rank 0 then calls that handler, which is exactly
what submitit would do on the signal: it asks ``TrainTask.checkpoint`` for the next
submission (refused, with a message, past ``slurm.max_requeues`` or when the newest checkpoint
has not moved since the last requeue), pickles it and runs ``scontrol requeue``. The other
ranks wait to be stopped by the requeue. The requeued job resumes from the checkpoint.

Done: once the trainer has finished its work, the task ignores stop signals until it has
exited. Slurm sends the time-limit USR2 up to ~40 s early; landing there, it would make
submitit requeue a finished job, or kill the exiting task and fail the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from jobs.spec import JobSpec, trainer_argv
from jobs.values import FrozenMap, SpecError
from slurm.slurm_cli import SlurmError, preflight

EXIT_OK, EXIT_PREEMPTED = 0, 143
DEFAULT_TIMEOUT_MIN = 60  # submitit always writes --time; used when slurm.time is unset
REQUEUE_WAIT_S = 30.0  # ranks > 0 wait this long for rank 0's requeue to stop them


# -- the pure part: spec -> submitit parameters ---------------------------------------------------

def timeout_minutes(time_limit: str | None) -> int:
    """``slurm.time`` (minutes, or ``[D-]HH:MM:SS``) as whole minutes, rounded up."""
    if time_limit is None:
        return DEFAULT_TIMEOUT_MIN
    if time_limit.isdigit():
        return int(time_limit)
    days, _, clock = time_limit.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return max(1, -(-total // 60))


def extra_parameters(flags: Sequence[str]) -> dict[str, str | bool]:
    """``("--gres=gpu:1", "--requeue")`` -> ``{"gres": "gpu:1", "requeue": True}``."""
    out: dict[str, str | bool] = {}
    for i, flag in enumerate(flags):
        name, eq, value = flag.removeprefix("--").partition("=")
        if not flag.startswith("--") or not name or " " in name:
            raise SpecError(f"slurm.extra_flags[{i}]", f"{flag!r} is not a long sbatch option: "
                            "write it as --name=value (e.g. --gres=gpu:1) or --name")
        out[name] = value if eq else True
    return out


def log_folder(spec: JobSpec) -> str:
    """Where submitit keeps the pickles and each task's stdout/stderr: RUN_DIR/submitit/JOBID."""
    return f"{spec.run_dir}/submitit/%j"


def submitit_parameters(spec: JobSpec) -> dict[str, Any]:
    """Keyword arguments for ``AutoExecutor.update_parameters`` (pure: no I/O).

    ``nnodes`` MIN:MAX asks for MAX nodes: an elastic job that shrinks is the sbatch path's
    (torchrun with c10d rendezvous); here every rank is one Slurm task.
    """
    res, slurm = spec.resources, spec.slurm
    params: dict[str, Any] = {
        "name": spec.name,
        "nodes": spec.nnodes.max,
        "tasks_per_node": spec.nproc_per_node,
        "timeout_min": timeout_minutes(slurm.time),
        "slurm_signal_delay_s": slurm.signal_delay,
    }
    if res.cpu is not None:
        params["cpus_per_task"] = max(1, int(res.cpu) // spec.nproc_per_node)
    if res.gpus:
        params["gpus_per_node"] = res.gpus
    if res.memory is not None:
        params["slurm_mem"] = f"{res.memory.mib}M"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(slurm, key) is not None:
            params[f"slurm_{key}"] = getattr(slurm, key)
    if slurm.exclusive:
        params["slurm_exclusive"] = True
    if slurm.extra_flags:
        params["slurm_additional_parameters"] = extra_parameters(slurm.extra_flags)
    return params


def trainer_command(spec: JobSpec) -> list[str]:
    """The trainer's argv: ``trainer.args`` rendered as everywhere, then the run's paths."""
    return [*trainer_argv(spec.trainer.args), "--run-dir", spec.run_dir,
            "--checkpoint-dir", spec.checkpoint_dir]


# -- the task every rank runs ---------------------------------------------------------------------

def newest_checkpoint_step(checkpoint_dir: str) -> int | None:
    """The step of the newest checkpoint that verifies (what a resumed run starts from)."""
    from trainer.checkpoint import CheckpointError, verify  # torch: only inside the job

    root = Path(checkpoint_dir)
    for path in sorted(root.glob("step_*"), reverse=True) if root.is_dir() else []:
        try:
            return int(verify(path)["position"]["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            continue
    return None


def _requeued_meanwhile() -> tuple[bool, str]:
    """Whether this job was requeued during this attempt (``scontrol requeue`` by hand counts
    a restart at once), and its state, from slurmctld."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    proc = subprocess.run(["scontrol", "show", "job", "--oneliner", job], capture_output=True,
                          text=True, timeout=60, check=False)
    fields = dict(f.partition("=")[::2] for f in proc.stdout.split() if "=" in f)
    restarts = int(fields.get("Restarts", "0") or 0)
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    return restarts > attempt, fields.get("JobState", "unknown")


class RequeueRefused(RuntimeError):
    """The job stopped at a checkpoint but is not requeued (the message says why)."""


@dataclasses.dataclass
class TrainTask(Checkpointable):
    """Runs the trainer in this Slurm task; picklable, and requeued by submitit at 143.

    ``requeues`` and ``last_step`` travel with the pickle that submitit writes at each
    requeue, so the budget and the progress check survive across attempts."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    checkpoint_dir: str
    max_requeues: int
    module: str = "trainer"
    script: str | None = None
    requeues: int = 0
    last_step: int | None = None

    @classmethod
    def from_spec(cls, spec: JobSpec) -> TrainTask:
        return cls(argv=tuple(trainer_command(spec)), env=dict(spec.env),
                   checkpoint_dir=spec.checkpoint_dir, max_requeues=spec.slurm.max_requeues,
                   module=spec.trainer.module, script=spec.trainer.script)

    def __call__(self) -> int:
        os.environ.update(self.env)
        self._mark_attempt()
        code = self._run()
        if code == EXIT_OK:
            from trainer.preempt import ignore_stop_signals  # torch: not at submission time
            ignore_stop_signals()  # a time-limit USR2 while submitit finishes must not requeue
            return code
        if code == EXIT_PREEMPTED:
            self._hand_over_to_submitit()
        sys.stdout.flush()
        raise SystemExit(code)  # the trainer's exit code is the task's: 2 config, 1 failure

    def _run(self) -> int:
        if self.module == "trainer" and self.script is None:
            from trainer.train import main
            return main(list(self.argv))
        import runpy

        from trainer.env import DistEnv
        os.environ.update(DistEnv.from_environ().export())  # the contract, for env:// users
        saved = sys.argv
        sys.argv = [self.script or self.module, *self.argv]
        try:
            if self.script is not None:
                runpy.run_path(self.script, run_name="__main__")
            else:
                runpy.run_module(self.module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = saved
        return EXIT_OK

    @staticmethod
    def _mark_attempt() -> None:
        """Where this attempt starts in the rank's appended log files (slurm.slurm_logs)."""
        line = (f"torchjob: job {os.environ.get('SLURM_JOB_ID', '?')} attempt "
                f"{os.environ.get('SLURM_RESTART_COUNT', '0')} rank "
                f"{os.environ.get('SLURM_PROCID', '0')}")
        for stream in (sys.stdout, sys.stderr):
            print(line, file=stream, flush=True)

    def _hand_over_to_submitit(self) -> None:
        """Stopped after a checkpoint: let submitit's own signal handler requeue (rank 0)."""
        handler = signal.getsignal(signal.SIGUSR2)
        if not callable(handler) or getattr(handler, "__name__", "") != \
                "checkpoint_and_try_requeue":
            return  # not under submitit (e.g. called directly): just exit 143
        if int(os.environ.get("SLURM_PROCID", "0")) != 0:
            time.sleep(REQUEUE_WAIT_S)  # rank 0 requeues the job, which stops this task
            return
        try:
            handler(signal.SIGUSR2, None)  # calls checkpoint(), requeues, exits
        except subprocess.CalledProcessError:
            requeued, state = _requeued_meanwhile()  # the next attempt's pickle is written
            if requeued:
                print("torchjob: the job was already requeued (e.g. `scontrol requeue` by "
                      "hand); the next attempt resumes from the checkpoint", file=sys.stderr,
                      flush=True)
                return
            raise RequeueRefused(f"scontrol requeue failed (job state {state}): was the job "
                                 "cancelled? Submit it again to continue from its "
                                 "checkpoint") from None

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """The next attempt: this task with one requeue more, unless the budget is spent or
        the newest checkpoint has not moved since the last requeue."""
        step = newest_checkpoint_step(self.checkpoint_dir)
        shown = "none" if step is None else f"step {step}"
        if self.requeues >= self.max_requeues:
            raise RequeueRefused(f"not requeued: the job was already requeued {self.requeues} "
                                 f"time(s), slurm.max_requeues is {self.max_requeues}; newest "
                                 f"checkpoint: {shown}. Raise slurm.max_requeues or slurm.time, "
                                 "or submit again to continue from the checkpoint")
        if self.requeues and step == self.last_step:
            raise RequeueRefused(f"not requeued: no progress since the last requeue (the newest "
                                 f"checkpoint in {self.checkpoint_dir} is still {shown}). The "
                                 "attempt stopped before it could checkpoint again: raise "
                                 "slurm.time, or lower slurm.signal_delay or the trainer's "
                                 "--checkpoint-every so an attempt can make progress")
        print(f"torchjob: requeue {self.requeues + 1} of {self.max_requeues} from checkpoint "
              f"{shown}", file=sys.stderr, flush=True)
        nxt = dataclasses.replace(self, requeues=self.requeues + 1, last_step=step)
        return DelayedSubmission(nxt, *args, **kwargs)


# -- submission -----------------------------------------------------------------------------------

def executor(spec: JobSpec, folder: str | Path | None = None) -> submitit.AutoExecutor:
    """A Slurm AutoExecutor set up for ``spec`` (after checking the cluster can take it)."""
    preflight(partition=spec.slurm.partition, nodes=spec.nnodes.max)
    ex = submitit.AutoExecutor(folder=folder or log_folder(spec), cluster="slurm",
                               slurm_max_num_timeout=spec.slurm.max_requeues)
    ex.update_parameters(**submitit_parameters(spec))
    return ex


def submit(spec: JobSpec, *, folder: str | Path | None = None) -> str:
    """Submit ``spec`` as one Slurm job through submitit; its job id.

    Raises SlurmError (exit code 2) when the cluster cannot take the job; nothing is queued
    then."""
    ex = executor(spec, folder)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr too
            job = ex.submit(TrainTask.from_spec(spec))
    except submitit.core.utils.FailedJobError as exc:
        raise SlurmError(f"sbatch refused the job: {_sbatch_message(exc)}") from None
    return str(job.job_id)


def sweep_specs(spec: JobSpec, sweep: Mapping[str, Sequence[Any]]) -> list[JobSpec]:
    """One spec per point of the grid ``{trainer arg: values}``, each in its own run dir."""
    from trainer.config import field_types

    types = field_types()
    for key in sweep:
        if key not in types:
            raise SpecError(f"sweep.{key}", "is not a trainer argument (e.g. lr=1e-3,3e-3)")
    out = []
    for point in itertools.product(*(list(v) for v in sweep.values())):
        args = dict(spec.trainer.args)
        label = []
        for key, value in zip(sweep, point):
            typed = types[key](value) if types[key] is not bool or not isinstance(value, str) \
                else value.lower() in ("1", "true", "yes", "on")
            args[key] = typed
            label.append(f"{key}={value}")
        run_dir = f"{spec.run_dir}/{','.join(label)}"
        out.append(dataclasses.replace(
            spec, trainer=dataclasses.replace(spec.trainer, args=FrozenMap(args)),
            run_dir=run_dir, checkpoint_dir=_swept_checkpoint_dir(spec, run_dir)))
    return out


def _swept_checkpoint_dir(spec: JobSpec, run_dir: str) -> str:
    default = f"{spec.run_dir}/checkpoints"
    return f"{run_dir}/checkpoints" if spec.checkpoint_dir == default else \
        f"{spec.checkpoint_dir}/{Path(run_dir).name}"


def submit_sweep(spec: JobSpec, sweep: Mapping[str, Sequence[Any]], *,
                 folder: str | Path | None = None) -> list[str]:
    """``--sweep lr=1e-3,3e-3``: one Slurm job array, a task per point; the array job ids."""
    specs = sweep_specs(spec, sweep)
    ex = executor(spec, folder)
    try:
        with contextlib.redirect_stderr(io.StringIO()), ex.batch():
            jobs = [ex.submit(TrainTask.from_spec(s)) for s in specs]
    except submitit.core.utils.FailedJobError as exc:
        raise SlurmError(f"sbatch refused the job array: {_sbatch_message(exc)}") from None
    return [str(job.job_id) for job in jobs]


def _sbatch_message(exc: Exception) -> str:
    """sbatch's error lines, joined: ``Memory specification can not be satisfied; ...``."""
    lines = [line.strip().removeprefix("sbatch: error: ") for line in str(exc).splitlines()]
    return "; ".join(dict.fromkeys(line for line in lines if line)) or "no message"

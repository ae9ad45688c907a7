"""The Slurm backend: ``slurm`` submits through submitit, ``slurm:sbatch`` with plain ``sbatch``;
both send the batch script ``render`` prints (``torchjob.slurm.sbatch``), byte for byte.

Handles are ``slurm:JOB_ID`` (a sweep's array ``slurm:1234``, one point ``slurm:1234_0``);
status comes from accounting (slurm.status), logs from the run directory (slurm.logs).
``cancel`` asks the job to checkpoint and stop (USR1: exit 143, no requeue); ``run`` follows
the logs, like ``srun``, until the job has ended and returns its exit code.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path

from torchjob.jobs.backend import (BackendError, Backend, Context, Handle, JobStatus, Request)
from torchjob.jobs.progress import Progress
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.checks import gpus_asked
from torchjob.jobs.values import DNS_1035, DNS_LABEL_MAX, SpecError, UserError
from torchjob.slurm import cluster, status
from torchjob.slurm.executor import CANCEL_SIGNAL, ScriptExecutor, sbatch_message
from torchjob.slurm.sbatch import SWEEP_POINT_LINE, directives, render_sbatch
from torchjob.slurm.cluster import SlurmError
from torchjob.slurm.logs import Follower, first_failures, job_logs, log_files

JOB_ID = re.compile(r"\d+(_\d+)?")
POLL_S = 0.5  # how often `run` and `logs --follow` read the logs and ask squeue
SUBMITIT_FOLDER = "submitit"  # under the run directory: submitit's copy of the script


def point_dir(status: JobStatus) -> str:
    """Where the job or task of ``status`` writes its progress: for a task of a sweep, its
    point's run directory, ``WorkDir/LABEL``, from the first line of its output
    (sbatch.SWEEP_POINT_LINE); else the run directory (Slurm's WorkDir)."""
    task = status.handle.id
    if "_" not in task or not status.run_dir:
        return status.run_dir
    try:
        with open(Path(status.run_dir) / f"slurm-{task}.out", "rb") as out:
            head = out.read(4096).decode("utf-8", "replace")
    except OSError:
        return status.run_dir
    found = re.search(rf"^{re.escape(SWEEP_POINT_LINE)}\d+: (.+)$", head, re.MULTILINE)
    label = found[1].strip() if found else ""
    if not label or "/" in label or label in (".", ".."):
        return status.run_dir
    return str(Path(status.run_dir) / label)


class SlurmBackend(Backend):
    """One batch script per job, handed to sbatch by submitit."""

    name = "slurm"
    native_sweep = True  # a sweep is one job array (Context.sweep)
    sees_run_dir = True  # a cluster's shared filesystem, from where the job is submitted
    env_secrets = True  # sbatch exports the submitting environment

    # -- before anything is queued ---------------------------------------------------------

    def fits(self, spec: JobSpec) -> None:
        gpus_asked(spec.nproc_per_node, spec.resources.gpus, "Slurm")
        try:  # the values each #SBATCH line holds (a workdir of its own is render's)
            directives(spec, workdir="/")
        except ValueError as exc:
            raise UserError(str(exc)) from None

    def nodes_python(self, request: Request) -> str | None:
        # without a container the nodes run this interpreter from the shared file system
        return request.context.python if request.spec.slurm.container == "none" else None

    def ready(self, request: Request) -> None:
        spec = request.spec
        cluster.preflight(partition=spec.slurm.partition, min_nodes=spec.nnodes.min,
                            max_nodes=spec.nnodes.max)

    def render(self, spec: JobSpec, context: Context) -> Request:
        # in a container (pyxis, apptainer) the image's interpreter, else this one's: the
        # nodes share this file system
        python = "python" if spec.slurm.container != "none" else context.python
        try:
            text = render_sbatch(spec, python=python, workdir=context.workdir,
                                 sweep=context.sweep)
        except SpecError:
            raise
        except ValueError as exc:  # a value no #SBATCH line can hold, a relative workdir
            raise UserError(str(exc)) from None
        return Request(self.name, spec.name, text, text, spec, context)

    # -- submitting ------------------------------------------------------------------------

    def submit(self, request: Request) -> Handle:
        """Create the run directory (Slurm opens the logs there before the script runs), then
        hand the script to sbatch: through submitit, or directly."""
        run_dir = self._run_dir(request)
        run_dir.mkdir(parents=True, exist_ok=True)
        return Handle("slurm", self._sbatch(request.data, run_dir))

    def _sbatch(self, script: str, run_dir: Path) -> str:
        """The job id; submitit keeps the script as RUN_DIR/submitit/JOB_ID_submission.sh."""
        return ScriptExecutor(run_dir / SUBMITIT_FOLDER, script).submit_script().job_id

    @staticmethod
    def _run_dir(request: Request) -> Path:
        return Path(request.context.workdir, request.spec.run_dir)

    def follow(self, handle: Handle, request: Request) -> Iterator[str]:
        return self._follow(handle, Follower(self._run_dir(request), _tasks(handle, request.data)))

    def logs_place(self, handle: Handle, request: Request) -> str:
        return " and ".join(str(path) for task in _tasks(handle, request.data)
                            for path in log_files(self._run_dir(request), task))

    def wait(self, handle: Handle) -> JobStatus:
        while not self._ended(handle):
            time.sleep(POLL_S)
        return self.status(handle)

    def _ended(self, handle: Handle) -> bool:
        """Out of the queue, and accounting says it ended, twice a moment apart: a job being
        requeued can look ended for an instant."""
        for i in range(2):
            if cluster.queued(handle.id) or not status.current(handle).state.terminal:
                return False
            if i == 0:
                time.sleep(POLL_S)
        return True

    def _follow(self, handle: Handle, follower: Follower) -> Iterator[str]:
        while True:
            ended = self._ended(handle)
            yield from follower.poll(final=ended)
            if ended:
                return
            time.sleep(POLL_S)

    # -- a submitted job -------------------------------------------------------------------

    def parse_handle(self, text: str) -> Handle:
        if JOB_ID.fullmatch(text):
            return Handle("slurm", text)
        if DNS_1035.fullmatch(text) and len(text) <= DNS_LABEL_MAX:  # a job's name: its latest job of this user's (sacct)
            live, records = cluster.mine()
            named = [r["JobID"] for r in records if r.get("JobName") == text
                     and "_" not in r["JobID"] and "." not in r["JobID"]]
            if named:
                return Handle("slurm", max(named, key=lambda job: int(job.split("_")[0])))
            raise BackendError(f"no Slurm job named {text!r} of yours in the last week "
                               "(torchjob list --to slurm shows them): write slurm:JOB_ID")
        raise BackendError(f"{text!r} is not a Slurm job id: write slurm:1234 (or "
                           "slurm:1234_0 for one task of a job array, or slurm:NAME for that "
                           "job's latest)")

    def status(self, handle: Handle) -> JobStatus:
        return status.current(handle)

    def progress(self, status: JobStatus) -> Progress | None:
        """A job's, or a task's from its sweep point's run directory; an array's is its
        tasks' (``tasks``), each as ``torchjob status slurm:ID_I`` shows it."""
        if len(status.raw) > 1:
            tasks = {task: self.progress(dataclasses.replace(
                status, handle=Handle("slurm", task), raw={task: record}))
                for task, record in status.raw.items()}
            return Progress(tasks={task: told or Progress() for task, told in tasks.items()})
        return super().progress(dataclasses.replace(status, run_dir=point_dir(status)))

    def logs(self, handle: Handle, *, follow: bool = False,
             log_dir: str | None = None) -> Iterator[str]:
        """The run directory's logs (the job's working directory; ``log_dir`` once Slurm
        has forgotten the job)."""
        found = cluster.where(handle.id)
        if found is not None:
            folder, tasks = Path(log_dir or found[0]), found[1]
        elif log_dir is not None:  # an array's tasks, or the one job
            folder = Path(log_dir)
            tasks = sorted(p.name[6:-4] for p in folder.glob(f"slurm-{handle.id}_*.out")) \
                or [handle.id]
        else:
            raise SlurmError(f"Slurm knows no job {handle.id!r}: check the id that torchjob "
                             "submit printed (sacct -X lists recent jobs), or pass --log-dir "
                             "RUN_DIR for a job Slurm has forgotten")
        if follow:
            yield from self._follow(handle, Follower(folder, tasks))
            return
        for task in tasks:
            logs = job_logs(folder, task)
            label = f"[{task}] " if len(tasks) > 1 else ""
            yield from (label + line for line in logs.formatted())
            yield from (label + line for line in first_failures(logs))

    def cancel(self, handle: Handle) -> str:
        self.status(handle)  # an unknown job is a SlurmError
        # pending tasks first: one that starts meanwhile is running when the signal goes out
        pending = cluster.queued(handle.id, states="PENDING")
        if pending:
            cluster.run(["scancel", "--state=PENDING", handle.id])
        running = cluster.signal_batch(handle.id, CANCEL_SIGNAL)
        done = []
        if running:
            done.append(f"asked {' '.join(running)} to checkpoint and stop (exit 143)")
        if pending:
            done.append(f"removed pending {' '.join(pending)}")
        return "; ".join(done) or f"{handle} had already ended"

    def list(self) -> list[JobStatus]:
        live, records = cluster.mine()
        out = []
        for record in (dict(r, JobID=task) for r in records
                       for task in cluster.task_ids([r["JobID"]])):
            job_id = record["JobID"]
            ours = job_id in live or any(
                Path(record.get("WorkDir", ""), name).exists()
                for name in (f"slurm-{job_id}.out", f"slurm-{job_id}.err"))
            if ours:
                handle = Handle("slurm", job_id)
                out.append(status.from_records(handle, [record],
                                               [job_id] if job_id in live else []))
        return out


def _tasks(handle: Handle, script: str) -> list[str]:
    """The job's task ids: ``1234``, or an array's ``1234_0`` ... (``#SBATCH --array=0-N``)."""
    found = re.search(r"^#SBATCH --array=0-(\d+)$", script, re.M)
    return [f"{handle.id}_{i}" for i in range(int(found[1]) + 1)] if found else [handle.id]


class SbatchBackend(SlurmBackend):
    """The same script, handed to ``sbatch`` directly (on its standard input)."""

    name = "slurm:sbatch"

    def _sbatch(self, script: str, run_dir: Path) -> str:
        proc = cluster.run(["sbatch", "--parsable"], input=script)
        if proc.returncode != 0:
            raise SlurmError(f"sbatch refused the job: {sbatch_message(proc.stderr)}")
        return proc.stdout.strip().split(";")[0]


VARIANTS: dict[str, type[SlurmBackend]] = {"": SlurmBackend, "sbatch": SbatchBackend}


def create(variant: str) -> SlurmBackend:
    """The ``torchjob.backends`` entry point: ``slurm`` (submitit) or ``slurm:sbatch``."""
    if variant not in VARIANTS:
        raise BackendError(f"backend 'slurm' has no variant {variant!r}: use slurm (through "
                           "submitit) or slurm:sbatch (plain sbatch)")
    return VARIANTS[variant]()

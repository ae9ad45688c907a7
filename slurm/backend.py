"""The Slurm backends: ``slurm`` (submitted through submitit) and ``slurm:sbatch`` (the
rendered script, for ``sbatch`` by hand). Handles: ``slurm:JOB_ID``.

Transitional: ``render`` shows the sbatch script of ``slurm.sbatch`` while ``submit`` still
goes through submitit's per-rank TrainTask (``slurm.submitit_job``); issue 11 makes submitit
submit the rendered script itself.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

from jobs.backend import BackendError, BaseBackend, Context, Handle, JobStatus, Request, State
from jobs.spec import JobSpec
from slurm import slurm_cli
from slurm.sbatch import render_sbatch

STATES = {"PENDING": State.PENDING, "RUNNING": State.RUNNING, "REQUEUED": State.PENDING,
          "COMPLETED": State.SUCCEEDED, "FAILED": State.FAILED, "CANCELLED": State.CANCELLED,
          "TIMEOUT": State.FAILED, "OUT_OF_MEMORY": State.FAILED, "NODE_FAIL": State.FAILED,
          "PREEMPTED": State.STOPPED, "BOOT_FAIL": State.FAILED, "DEADLINE": State.FAILED}


class SlurmBackend(BaseBackend):
    native_sweep = True  # job arrays
    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.name = f"slurm:{variant}" if variant else "slurm"

    def render(self, spec: JobSpec, context: Context) -> Request:
        try:
            script = render_sbatch(spec, python=context.python, workdir=context.workdir)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        return Request(self.name, spec.name, script, script, spec, context)

    def submit(self, request: Request) -> Handle:
        if self.variant == "sbatch":
            raise BackendError("slurm:sbatch is a script to submit by hand: torchjob render "
                               "--to slurm:sbatch JOB.yaml > job.sbatch && sbatch job.sbatch")
        from slurm import submitit_job
        assert request.spec is not None and request.context is not None
        sweep = request.context.options.get("sweep") or {}
        ids = submitit_job.submit_sweep(request.spec, sweep) if sweep \
            else [submitit_job.submit(request.spec)]
        return Handle("slurm", ",".join(ids))

    def parse_handle(self, text: str) -> Handle:
        if not re.fullmatch(r"\d+(_\d+)?(,\d+(_\d+)?)*", text):
            raise BackendError(f"{text!r} is not a Slurm job id (e.g. slurm:1234)")
        return Handle("slurm", text)

    def status(self, handle: Handle) -> JobStatus:
        state = slurm_cli.state(handle.id)
        if not state:
            raise slurm_cli.SlurmError(f"Slurm's accounting knows no job {handle.id!r}: check "
                                       "the id that torchjob submit printed (sacct -X lists "
                                       "recent jobs)")
        word = state.split()[0].rstrip("+")
        return JobStatus(handle, STATES.get(word, State.UNKNOWN), detail=state,
                         raw={"sacct_state": state})

    def cancel(self, handle: Handle) -> str:
        slurm_cli.cancel(handle.id)
        return f"cancelled {handle} (its tasks checkpoint and stop)"

    def logs(self, handle: Handle, *, follow: bool = False,
             log_dir: str | None = None) -> Iterator[str]:
        from slurm.slurm_logs import job_logs
        folder = log_dir or slurm_cli.log_folder_of(handle.id)
        if folder is None:
            raise BackendError(f"Slurm no longer knows where job {handle.id} wrote its logs: "
                               "pass --log-dir RUN_DIR/submitit/JOB_ID (submit) or RUN_DIR "
                               "(a rendered sbatch script)")
        logs = job_logs(folder, handle.id)
        if not logs.lines:
            raise BackendError(f"no logs of job {handle.id} in {folder}")
        yield from logs.formatted()
        for attempt, rank in sorted(logs.first_failing.items()):
            print(f"attempt {attempt}: first failing rank: {rank}", file=sys.stderr)


def create(variant: str) -> SlurmBackend:
    if variant not in ("", "sbatch"):
        raise BackendError(f"unknown Slurm variant {variant!r}: slurm (through submitit) or "
                           "slurm:sbatch")
    return SlurmBackend(variant)

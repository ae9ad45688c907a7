"""submitit as the engine of the ``slurm`` backend, handing ``sbatch`` our script unchanged.

``ScriptExecutor`` is submitit's ``SlurmExecutor`` with our script (the text ``torchjob render
--to slurm`` prints, byte for byte) as its submission file and no function pickled. Nothing
writes the result pickle submitit waits for, so ``ScriptJob`` answers ``done``, ``result``
and ``exception`` from accounting (the job's exit code); ``cancel`` asks the job to
checkpoint and stop.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path
from typing import Any

from submitit.core.utils import FailedJobError
from submitit.slurm.slurm import SlurmExecutor, SlurmJob

from torchjob.jobs.backend import Handle, JobStatus
from torchjob.slurm import cluster, status
from torchjob.slurm.cluster import SlurmError
from torchjob.trainer.contract import EXIT_OK

CANCEL_SIGNAL = "USR1"  # the script's "checkpoint and stop for good" (USR2: and requeue)


class ScriptJob(SlurmJob[int]):
    """A job whose script is ours: its result is its exit code, read from accounting."""

    def status(self) -> JobStatus:
        return status.current(Handle("slurm", self.job_id))

    def done(self, force_check: bool = False) -> bool:
        return self.status().state.terminal

    def wait(self, poll: float = 1.0) -> None:
        while not self.done():
            time.sleep(poll)

    def result(self) -> int:
        """The job's exit code once it has ended (0 done, 1 failed, 2 bad configuration,
        143 stopped after a checkpoint)."""
        self.wait()
        code = self.status().exit_code
        return EXIT_OK if code is None else code

    def results(self) -> list[int]:
        return [self.result()]

    def exception(self) -> FailedJobError | None:
        code = self.result()
        if code == EXIT_OK:
            return None
        return FailedJobError(f"Slurm job {self.job_id} exited {code}: see "
                              f"`torchjob logs slurm:{self.job_id}`")

    def cancel(self, check: bool = True) -> None:
        """Checkpoint and stop (running tasks), or leave the queue (pending ones)."""
        cluster.signal_batch(self.job_id, CANCEL_SIGNAL)
        cluster.run(["scancel", "--state=PENDING", self.job_id])


class ScriptExecutor(SlurmExecutor):
    """submitit's Slurm executor whose submission file is ``script``."""

    job_class = ScriptJob

    def __init__(self, folder: str | Path, script: str) -> None:
        super().__init__(folder, max_num_timeout=0)
        self.script = script

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self.script

    def _num_tasks(self) -> int:
        return 1  # the job is one thing to wait for; its nodes are the script's business

    def submit_script(self) -> ScriptJob:
        """``sbatch`` the script (through submitit); the job. A refusal is a SlurmError."""
        Path(self.folder).mkdir(parents=True, exist_ok=True)  # submitting writes the file here
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes sbatch's stderr
                job: Any = self._submit_command(self._submitit_command_str)
        except FailedJobError as exc:
            raise SlurmError(f"sbatch refused the job: {sbatch_message(str(exc))}") from None
        assert isinstance(job, ScriptJob)
        return job


def sbatch_message(stderr: str) -> str:
    """sbatch's error lines, joined: ``Memory specification can not be satisfied; ...``."""
    lines = [line.strip().removeprefix("sbatch: error: ") for line in stderr.splitlines()]
    return "; ".join(dict.fromkeys(line for line in lines if line)) or "no message"

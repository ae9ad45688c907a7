"""A Slurm job's state and exit code from its accounting records (the README's exit table)."""

from __future__ import annotations

import pytest

from torchjob.jobs.backend import Handle, State
from torchjob.slurm.cluster import SlurmError, task_ids
from torchjob.slurm.status import from_records

JOB = Handle("slurm", "12")


def record(state: str, code: str = "0:0", job_id: str = "12") -> dict[str, str]:
    return {"JobID": job_id, "JobName": "digits", "State": state, "ExitCode": code}


@pytest.mark.parametrize("state, code, want, exit_code", [
    ("COMPLETED", "0:0", State.SUCCEEDED, 0),
    ("FAILED", "1:0", State.FAILED, 1),
    ("FAILED", "2:0", State.FAILED, 2),  # a configuration error
    ("FAILED", "143:0", State.STOPPED, 143),  # stopped after a checkpoint, not requeued
    ("FAILED", "15:0", State.STOPPED, 143),  # the same: Slurm 22.05 records exit 143 as 15
    ("FAILED", "9:0", State.FAILED, 1),  # a step killed (exit 137): a failure
    ("CANCELLED by 0", "0:15", State.CANCELLED, 143),
    ("TIMEOUT", "0:0", State.FAILED, 1),
    ("OUT_OF_MEMORY", "0:125", State.FAILED, 1),
    ("PREEMPTED", "0:15", State.STOPPED, 143),
])
def test_an_ended_job(state: str, code: str, want: State, exit_code: int) -> None:
    status = from_records(JOB, [record(state, code)], [])
    assert (status.state, status.exit_code, status.name) == (want, exit_code, "digits")
    assert status.detail.startswith(state.split()[0])


@pytest.mark.parametrize("state, queued, want", [
    ("PENDING", ["12"], State.PENDING), ("RUNNING", ["12"], State.RUNNING),
    ("REQUEUED", ["12"], State.PENDING), ("RUNNING", [], State.RUNNING),  # accounting lags
    ("FAILED", ["12"], State.PENDING),  # ended an attempt, requeued: back in the queue
])
def test_a_job_not_yet_ended(state: str, queued: list[str], want: State) -> None:
    status = from_records(JOB, [record(state, "143:0")], queued)
    assert (status.state, status.exit_code) == (want, None)


def test_an_array_is_its_tasks_together() -> None:
    array = Handle("slurm", "20")
    done, failed = record("COMPLETED", job_id="20_0"), record("FAILED", "2:0", job_id="20_1")
    status = from_records(array, [done, record("RUNNING", job_id="20_1")], ["20_1"])
    assert status.state == State.RUNNING
    status = from_records(array, [done, failed], [])
    assert (status.state, status.exit_code) == (State.FAILED, 2)
    assert status.detail == "20_0: COMPLETED; 20_1: FAILED (exit 2): a configuration error"
    assert from_records(array, [done, done], []).exit_code == 0
    # slurmdbd has not yet recorded task 1, which slurmctld has ended: not ended yet
    status = from_records(array, [done], [], ["20_0", "20_1"])
    assert (status.state, status.exit_code) == (State.RUNNING, None)
    assert status.detail.endswith("not yet in Slurm's accounting: 20_1")
    both = [done, record("COMPLETED", job_id="20_1")]
    assert from_records(array, both, [], ["20_1", "20_0"]).state == State.SUCCEEDED
    assert task_ids(["20_[0-2,5%2]", "21", "20_7"]) == ["20_0", "20_1", "20_2", "20_5", "21",
                                                       "20_7"]


def test_a_job_in_the_queue_before_accounting_knows_it_is_pending() -> None:
    """Right after sbatch, squeue lists the job a moment before sacct does: status and cancel
    must not call it unknown (the README's submit-then-cancel session did, now and then)."""
    status = from_records(JOB, [], ["12"])
    assert (status.state, status.exit_code) == (State.PENDING, None)


def test_an_unknown_job_is_a_configuration_error() -> None:
    with pytest.raises(SlurmError, match="knows no job '12'") as info:
        from_records(JOB, [], [])
    assert info.value.exit_code == 2

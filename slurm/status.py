"""A Slurm job's state and exit code, from accounting (``sacct``) and the queue (``squeue``).

The job's exit code is its batch script's: 0, 1, 2 or 143, any other a failure (1); sacct
(Slurm 22.05) records a code above 128 less 128 (``exit 143`` reads ``15:0``). A job array's
state is its tasks' together: running while one runs, then the worst ending (a failure
before a stop before success).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from signal import SIGUSR1
from typing import Any

from torchjob.jobs.backend import Handle, JobStatus, State
from torchjob.slurm import cluster
from torchjob.slurm.cluster import SlurmError
from torchjob.trainer.contract import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_STOPPED

PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT",
           "STOPPED"}  # Slurm's STOPPED: the processes were sent SIGSTOP, they still hold nodes
FAILED = {"TIMEOUT": "the time limit ended it before it stopped: raise slurm.time, or "
                     "slurm.signal_delay so that it checkpoints and requeues in time",
          "OUT_OF_MEMORY": "out of memory: raise resources.memory",
          "NODE_FAIL": "a node failed", "BOOT_FAIL": "a node failed to boot",
          "DEADLINE": "its deadline passed"}
# which ending wins when an array's tasks end differently
SEVERITY = {State.SUCCEEDED: 0, State.STOPPED: 1, State.CANCELLED: 2, State.FAILED: 3}


def exit_code(text: str) -> tuple[int, int]:
    """sacct's ``ExitCode`` ``143:0`` -> (143, 0): the script's exit code, the signal."""
    code, _, signal = text.partition(":")
    return int(code or 0), int(signal or 0)


def one(record: Mapping[str, str]) -> tuple[State, int | None, str]:
    """One sacct record -> (state, the job's exit code once it ended, Slurm's words)."""
    slurm_state = (record.get("State", "").split() or ["UNKNOWN"])[0]
    code, signal = exit_code(record.get("ExitCode", "0:0"))
    words = slurm_state + (f" (exit {code})" if code else "") + \
        (f" (signal {signal})" if signal else "")
    if slurm_state in PENDING:
        return State.PENDING, None, words
    if slurm_state in RUNNING:
        return State.RUNNING, None, words
    if slurm_state == "COMPLETED":
        return State.SUCCEEDED, EXIT_OK, words
    if slurm_state == "CANCELLED":
        return State.CANCELLED, EXIT_STOPPED, words
    if signal == SIGUSR1:  # torchjob cancel's signal reached the batch shell before its trap
        return State.CANCELLED, EXIT_STOPPED, words + ": cancelled as it started"
    if slurm_state == "PREEMPTED":
        return State.STOPPED, EXIT_STOPPED, words + ": preempted, not requeued"
    if slurm_state == "FAILED" and code in (EXIT_STOPPED, EXIT_STOPPED - 128):
        return State.STOPPED, EXIT_STOPPED, words + ": stopped after a checkpoint; submit " \
            "again to continue"
    if slurm_state == "FAILED" and code == EXIT_CONFIG:
        return State.FAILED, EXIT_CONFIG, words + ": a configuration error"
    if slurm_state in FAILED or slurm_state == "FAILED":
        return State.FAILED, EXIT_FAILED, f"{words}: {FAILED.get(slurm_state, 'failed')}"
    return State.UNKNOWN, None, words


def when_where(record: Mapping[str, str]) -> dict[str, Any]:
    """``created`` and ``run_dir`` of a JobStatus from a sacct record (Submit, WorkDir: the
    directory the job was submitted from, where its run directories are relative to)."""
    try:
        created: float | None = datetime.datetime.fromisoformat(record.get("Submit", "")) \
            .timestamp()
    except ValueError:
        created = None
    return {"created": created, "run_dir": record.get("WorkDir", "")}


def from_records(handle: Handle, records: Sequence[Mapping[str, str]],
                 queued: Sequence[str], held: Sequence[str] = ()) -> JobStatus:
    """The status of ``handle`` from its sacct records, its tasks still in the queue and the
    tasks slurmctld holds, ended ones too (squeue: accounting may lag behind the controller
    for a moment, never the other way: an array whose task 0 ended has no record of it yet
    now and then; until it has, the array has not ended)."""
    if not records and queued:  # just submitted: the queue knows it, accounting not yet
        return JobStatus(handle, State.PENDING, None, "", "in the queue; not yet in Slurm's "
                         "accounting", {})
    if not records:
        raise SlurmError(f"Slurm's accounting knows no job {handle.id!r}: check the id that "
                         "torchjob submit printed (sacct -X lists recent jobs)")
    states = [one(r) for r in records]
    name = records[0].get("JobName", "")
    raw = {r["JobID"]: dict(r) for r in records}
    detail = "; ".join(f"{r['JobID']}: {words}" for r, (_, _, words) in zip(records, states)) \
        if len(records) > 1 else states[0][2]
    live = [s for s, _, _ in states if not s.terminal]
    recorded = set(cluster.task_ids(list(raw)))
    unrecorded = [task for task in held if task not in recorded]
    if unrecorded:
        detail += f"; not yet in Slurm's accounting: {', '.join(unrecorded)}"
        live.append(State.RUNNING)
    if live or queued:  # queued, accounting saying it ended: a requeue is due
        state = State.RUNNING if State.RUNNING in live else State.PENDING
        return JobStatus(handle, state, None, name, detail, raw, **when_where(records[0]))
    state, code, _ = max(states, key=lambda s: (SEVERITY.get(s[0], 3), s[1] == EXIT_CONFIG))
    return JobStatus(handle, state, code, name, detail, raw, **when_where(records[0]))


def current(handle: Handle) -> JobStatus:
    """What Slurm says now about ``handle`` (a job, an array, or one task ``A_I``)."""
    queued = cluster.queued(handle.id)
    held = cluster.held(handle.id)
    return from_records(handle, cluster.records([handle.id]), queued, held)

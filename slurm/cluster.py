"""Talking to Slurm's command line: checks before a submission, job state, cancel.

Everything here runs a Slurm client command (``sinfo``, ``sacct``, ``squeue``, ``scancel``)
as an argument list, never through a shell. A problem the user can fix before anything is
queued becomes a ``SlurmError`` (exit code 2) that says what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Sequence

from torchjob.jobs.values import UserError
from torchjob.slurm.sbatch import COMMENT
from torchjob.trainer.contract import EXIT_CONFIG

_DEVCLUSTER = "for a local two-node cluster run `bash slurm/devcluster up`"


class SlurmError(UserError):
    """The job cannot be submitted as asked (exit code 2); the message names the fix."""

    exit_code = EXIT_CONFIG


def run(argv: Sequence[str], *, timeout: float = 60,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one Slurm client command (``input`` on its standard input); a missing command
    becomes a SlurmError."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"`{argv[0]}` is not on PATH: this machine is not a Slurm submit host. "
                         f"Install Slurm's client commands (apt-get install slurm-client) and "
                         f"its configuration, or submit from a login node; {_DEVCLUSTER}")
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL,
                          check=False)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "(no output)"


def partitions() -> dict[str, list[str]]:
    """Partition -> its nodes; the default partition is listed under its name and ``""``."""
    proc = run(["sinfo", "--noheader", "--Node", "--format=%N %P"])
    if proc.returncode != 0:
        raise SlurmError(f"sinfo failed ({_first_line(proc.stderr)}): is slurmctld running? "
                         f"Check `scontrol ping`; {_DEVCLUSTER}")
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        node, _, part = line.strip().partition(" ")
        if not part:
            continue
        names = [part.rstrip("*")] + ([""] if part.endswith("*") else [])
        for name in names:
            if node not in out.setdefault(name, []):
                out[name].append(node)
    return out


def check_accounting() -> None:
    """submitit reads job states from ``sacct``: without accounting it cannot follow a job.
    Accounting turned off and its daemon unreachable are told apart: they are fixed apart."""
    proc = run(["sacct", "--noheader", "--allocations", "--starttime=now", "--format=JobID"])
    if proc.returncode == 0:
        return
    said = _first_line(proc.stderr)
    if "disabled" in proc.stderr.lower():
        raise SlurmError(f"sacct failed ({said}): this cluster has no job accounting, and "
                         "submitit follows jobs (and their requeues) through it. Enable "
                         "slurmdbd (AccountingStorageType=accounting_storage/slurmdbd in "
                         "slurm.conf), or use `torchjob render --to slurm` and sbatch the "
                         f"script yourself; {_DEVCLUSTER}")
    raise SlurmError(f"sacct failed ({said}): the cluster's accounting (slurmdbd) did not "
                     "answer, and submitit follows jobs (and their requeues) through it: is "
                     f"slurmdbd running? Check `sacctmgr show cluster`; {_DEVCLUSTER}")


def preflight(*, partition: str | None, min_nodes: int, max_nodes: int) -> None:
    """Stop before submitting: client commands, accounting, the partition and its size (an
    elastic job needs MIN nodes there to start, and is given at most MAX)."""
    for command in ("sbatch", "srun"):
        if shutil.which(command) is None:
            run([command])  # raises the SlurmError naming the command
    parts = partitions()  # the controller first: without it, accounting says little
    check_accounting()
    key = partition or ""
    if key not in parts:
        known = ", ".join(sorted(p for p in parts if p)) or "none"
        if partition is None:
            raise SlurmError(f"the cluster has no default partition: set slurm.partition to "
                             f"one of: {known}")
        raise SlurmError(f"slurm.partition: {partition!r} is not a partition of this cluster; "
                         f"partitions: {known} (see `sinfo -s`)")
    have = len(parts[key])
    if max_nodes > have:
        where = f"partition {partition!r}" if partition else "the default partition"
        asked = f"{max_nodes}" if min_nodes == max_nodes else f"up to {max_nodes}"
        raise SlurmError(f"nnodes: {asked} nodes were asked for but {where} has {have} "
                         f"({', '.join(parts[key])}); lower nnodes to at most {have} or choose "
                         "a bigger partition with slurm.partition")


def state(job_id: str) -> str:
    """The job's state from accounting (``RUNNING``, ``COMPLETED``, ...; ``""`` if unknown)."""
    proc = run(["sacct", "--noheader", "--allocations", "--parsable2", "--jobs", job_id,
                "--format=State"])
    states = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return states[-1] if proc.returncode == 0 and states else ""


def cancel(job_id: str) -> None:
    proc = run(["scancel", job_id])
    if proc.returncode != 0:
        raise SlurmError(f"scancel {job_id} failed: {_first_line(proc.stderr)}")


BATCH_START_S = 30.0  # a task RUNNING for slurmctld may take this long to have a batch shell


def signal_batch(job_id: str, signal: str) -> list[str]:
    """Send ``signal`` to the batch shell of every running task of ``job_id``; the tasks that
    were running (none: all pending, or already gone). A task that has just started may
    have no batch shell yet for the signal to reach: tried again until it has (or ended)."""
    deadline = time.monotonic() + BATCH_START_S
    while True:
        running = queued(job_id, states="RUNNING")
        if not running:
            return running
        proc = run(["scancel", "--batch", f"--signal={signal}", "--state=RUNNING", job_id])
        if proc.returncode == 0:
            return running
        if time.monotonic() > deadline:
            raise SlurmError(f"scancel --batch --signal={signal} {job_id} failed for "
                             f"{BATCH_START_S:g} s: {_first_line(proc.stderr)}")
        time.sleep(0.5)


def queued(job_id: str, *, states: str | None = None) -> list[str]:
    """The queued tasks of ``job_id`` (``1234``, or ``1234_0`` ... for an array), in ``states``
    (squeue's ``--states``, e.g. ``RUNNING``; default: pending, running and the like)."""
    argv = ["squeue", "--noheader", "--array", "--jobs", job_id, "--format=%i"]
    proc = run(argv + ([f"--states={states}"] if states else []))
    return proc.stdout.split() if proc.returncode == 0 else []


def held(job_id: str) -> list[str]:
    """Every task of ``job_id`` slurmctld still holds, ended ones too (for ``MinJobAge``
    seconds after they end): what accounting must show before the job counts as ended, as
    slurmdbd records a task a moment after the controller ends it."""
    return queued(job_id, states="all")


# what `sacct` tells about a job: one record per job, or per task of an array
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Submit", "Start", "End", "NodeList",
                "WorkDir")


def records(job_ids: Sequence[str] = (), *, user: str | None = None,
            since: str = "now-7days") -> list[dict[str, str]]:
    """Accounting records (``SACCT_FIELDS``) of ``job_ids``, or of ``user``'s jobs since
    ``since``; an array's pending tasks may come as one record ``1234_[1-3]``."""
    argv = ["sacct", "--noheader", "--allocations", "--parsable2",
            f"--format={','.join(SACCT_FIELDS)}"]
    argv += [f"--jobs={','.join(job_ids)}"] if job_ids else \
        [f"--user={user}" if user else "--allusers", f"--starttime={since}"]
    proc = run(argv)
    if proc.returncode != 0:
        raise SlurmError(f"sacct failed ({_first_line(proc.stderr)}): is slurmdbd running? "
                         f"{_DEVCLUSTER}")
    return [dict(zip(SACCT_FIELDS, line.split("|"))) for line in proc.stdout.splitlines()
            if line.strip()]


def task_ids(job_ids: Sequence[str]) -> list[str]:
    """``1234_[0-2,5%2]`` -> ``1234_0 1234_1 1234_2 1234_5``; other ids as they are."""
    out: list[str] = []
    for job_id in job_ids:
        main, bracket, ranges = job_id.partition("_[")
        if not bracket:
            out.append(job_id)
            continue
        for part in ranges.rstrip("]").split("%")[0].split(","):
            low, _, high = part.partition("-")
            out += [f"{main}_{i}" for i in range(int(low), int(high or low) + 1)]
    return out


def where(job_id: str) -> tuple[str, list[str]] | None:
    """The working directory of ``job_id`` and its task ids (``1234``, or ``1234_0`` ... for an
    array), from the queue while it is there, else from accounting; None if Slurm knows
    neither."""
    proc = run(["squeue", "--noheader", "--array", "--jobs", job_id, "--format=%i|%Z"])
    rows = [line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line] \
        if proc.returncode == 0 else []
    if not rows:
        rows = [[r["JobID"], r["WorkDir"]] for r in records([job_id])]
    if not rows:
        return None
    return rows[0][1], sorted(set(task_ids([r[0] for r in rows])), key=_task_order)


def _task_order(job_id: str) -> tuple[int, int]:
    main, _, task = job_id.partition("_")
    return int(main), int(task or -1)


def mine() -> tuple[list[str], list[dict[str, str]]]:
    """This user's jobs: the ids in the queue with torchjob's comment, and accounting's records
    of the last week."""
    user = pwd.getpwuid(os.getuid()).pw_name
    proc = run(["squeue", "--noheader", "--array", f"--user={user}", "--format=%i|%k"])
    live = [line.split("|", 1)[0] for line in proc.stdout.splitlines()
            if line.endswith(f"|{COMMENT}")] if proc.returncode == 0 else []
    return live, records(user=user)


def log_folder_of(job_id: str) -> str | None:
    """Where a job's logs are: its working directory (the run directory, ``--chdir``)."""
    found = where(job_id)
    return found[0] if found else None

"""Talking to Slurm's command line: checks before a submission, job state, cancel.

Everything here runs a Slurm client command (``sinfo``, ``sacct``, ``squeue``, ``scancel``)
as an argument list, never through a shell. A problem the user can fix before anything is
queued becomes a ``SlurmError`` (exit code 2) that says what is wrong and how to fix it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from jobs.values import UserError

EXIT_CONFIG = 2
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
                             "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"})
_DEVCLUSTER = "for a local two-node cluster run `bash slurm/devcluster up`"


class SlurmError(UserError):
    """The job cannot be submitted as asked (exit code 2); the message names the fix."""

    exit_code = EXIT_CONFIG


def run(argv: Sequence[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one Slurm client command; a missing command becomes a SlurmError."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"`{argv[0]}` is not on PATH: this machine is not a Slurm submit host. "
                         f"Install Slurm's client commands (apt-get install slurm-client) and "
                         f"its configuration, or submit from a login node; {_DEVCLUSTER}")
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


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
    """submitit reads job states from ``sacct``: without accounting it cannot follow a job."""
    proc = run(["sacct", "--noheader", "--allocations", "--starttime=now", "--format=JobID"])
    if proc.returncode != 0:
        raise SlurmError(f"sacct failed ({_first_line(proc.stderr)}): this cluster has no job "
                         "accounting, and submitit follows jobs (and their requeues) through "
                         "it. Enable slurmdbd (AccountingStorageType=accounting_storage/"
                         f"slurmdbd in slurm.conf), or use `torchjob render --to slurm` and "
                         f"sbatch the script yourself; {_DEVCLUSTER}")


def preflight(*, partition: str | None, nodes: int) -> None:
    """Stop before submitting: client commands, accounting, the partition and its size."""
    for command in ("sbatch", "srun"):
        if shutil.which(command) is None:
            run([command])  # raises the SlurmError naming the command
    check_accounting()
    parts = partitions()
    key = partition or ""
    if key not in parts:
        known = ", ".join(sorted(p for p in parts if p)) or "none"
        if partition is None:
            raise SlurmError(f"the cluster has no default partition: set slurm.partition to "
                             f"one of: {known}")
        raise SlurmError(f"slurm.partition: {partition!r} is not a partition of this cluster; "
                         f"partitions: {known} (see `sinfo -s`)")
    have = len(parts[key])
    if nodes > have:
        where = f"partition {partition!r}" if partition else "the default partition"
        raise SlurmError(f"nnodes: {nodes} nodes were asked for but {where} has {have} "
                         f"({', '.join(parts[key])}); lower nnodes to at most {have} or choose "
                         "a bigger partition with slurm.partition")


def in_queue(job_id: str) -> bool:
    """True while ``job_id`` (or any task of an array ``job_id``) is pending or running."""
    proc = run(["squeue", "--noheader", "--jobs", job_id, "--format=%i"])
    return proc.returncode == 0 and bool(proc.stdout.strip())


def queued_by_name(name: str) -> list[str]:
    """Ids of this user's queued jobs called ``name``."""
    proc = run(["squeue", "--noheader", "--me", "--name", name, "--format=%i"])
    return proc.stdout.split() if proc.returncode == 0 else []


def state(job_id: str) -> str:
    """The job's state from accounting (``RUNNING``, ``COMPLETED``, ...; ``""`` if unknown)."""
    proc = run(["sacct", "--noheader", "--allocations", "--parsable2", "--jobs", job_id,
                "--format=State"])
    states = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return states[-1] if proc.returncode == 0 and states else ""


def wait(job_id: str, *, timeout: float, poll: float = 1.0) -> str:
    """Block until ``job_id`` has left the queue for good; its final state from sacct."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not in_queue(job_id):
            final = state(job_id)
            if final in TERMINAL_STATES and (final != "PREEMPTED" or not in_queue(job_id)):
                return final
        time.sleep(poll)
    raise TimeoutError(f"Slurm job {job_id} still not finished after {timeout:.0f} s "
                       f"(state {state(job_id) or 'unknown'})")


def cancel(job_id: str) -> None:
    proc = run(["scancel", job_id])
    if proc.returncode != 0:
        raise SlurmError(f"scancel {job_id} failed: {_first_line(proc.stderr)}")


def log_folder_of(job_id: str) -> str | None:
    """Where a job's task logs are, from the controller's record (while it still knows it)."""
    proc = run(["scontrol", "show", "job", "-o", job_id.split("_")[0]])
    for word in proc.stdout.split():
        if word.startswith("StdErr=") or word.startswith("StdOut="):
            return str(Path(word.split("=", 1)[1]).parent)
    return None


def task_logs(folder: str | Path, job_id: str) -> dict[int, str]:
    """Each rank's stderr then stdout, from submitit's log folder (``RUN_DIR/submitit/%j``):
    ``{rank: text}``. Requeued attempts append to the same files."""
    folder = Path(str(folder).replace("%j", job_id))
    out: dict[int, str] = {}
    for path in sorted(folder.glob(f"{job_id}_*_log.err")):
        rank = int(path.name.removeprefix(f"{job_id}_").split("_")[0])
        stdout = path.with_suffix(".out")
        out[rank] = path.read_text(errors="replace") + (
            stdout.read_text(errors="replace") if stdout.exists() else "")
    return dict(sorted(out.items()))

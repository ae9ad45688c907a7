"""A Slurm job's logs, per attempt and per rank, for ``torchjob logs --to slurm JOB_ID``.

A requeued job runs several times (attempts 0, 1, ...) and appends every attempt to the same
files, so each attempt starts with a marker line (``torchjob: ... job J attempt N ...``):
``TrainTask`` prints one into each rank's files (submitit: ``RUN_DIR/submitit/J/J_R_log.{out,
err}``), and the rendered sbatch script into ``RUN_DIR/slurm-J.{out,err}``, where each worker
line also carries ``[attempt N rank R]: `` (torchrun's ``--tee`` with a line prefix). Lines
of the batch shell, srun and the agents belong to ``job`` instead of a rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"^torchjob: .*\bjob \S+ attempt (\d+)\b")
# submitit's first line of an attempt, written just before TrainTask's marker
SUBMITIT_START = re.compile(r"^submitit INFO \(.*\) - Starting with JobEnvironment")
SUBMITIT_ERROR = re.compile(r"^submitit ERROR \((.*?)\) - Submitted job triggered an exception")
RANK_PREFIX = re.compile(r"^\[attempt (\d+) rank (\d+)\]: ?")
# torchrun's report of a failed worker group: the rank that failed first on that node
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?time\s*: (\S+).*?"
                        r"rank\s*: (\d+)", re.S)
FAILURE = re.compile(r"Traceback \(most recent call last\)|^trainer \[rank \d+\]: ")
JOB = "job"  # lines of the batch shell, srun and the torchrun agents


@dataclass
class JobLogs:
    """``lines[(attempt, rank or "job")]`` and, per attempt with a failure, the rank that
    failed first."""

    lines: dict[tuple[int, int | str], list[str]] = field(default_factory=dict)
    first_failing: dict[int, int] = field(default_factory=dict)

    def add(self, attempt: int, source: int | str, line: str) -> None:
        self.lines.setdefault((attempt, source), []).append(line)

    def attempts(self) -> list[int]:
        return sorted({attempt for attempt, _ in self.lines})

    def formatted(self) -> Iterator[str]:
        """``[attempt A rank R] line``: attempt by attempt, rank by rank, then the job's."""
        def order(key: tuple[int, int | str]) -> tuple[int, int, int]:
            attempt, source = key
            return (attempt, 1, 0) if isinstance(source, str) else (attempt, 0, source)

        for attempt, source in sorted(self.lines, key=order):
            label = f"rank {source}" if isinstance(source, int) else source
            for line in self.lines[(attempt, source)]:
                yield f"[attempt {attempt} {label}] {line}"


def by_attempt(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """Each line with the attempt it belongs to. A submitit start line opens the next attempt
    before that attempt's marker says its number."""
    attempt, seen, pending = 0, False, list[str]()
    for line in lines:
        found = MARKER.match(line)
        if found:
            attempt, seen = int(found.group(1)), True
            yield from ((attempt, held) for held in pending)
            pending = []
            yield attempt, line
        elif pending or SUBMITIT_START.match(line):
            pending.append(line)
        else:
            yield attempt, line
    yield from ((attempt + seen, held) for held in pending)


def _read(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def submitit_logs(folder: Path, job_id: str) -> JobLogs:
    """Per-rank files ``J_R_log.err`` and ``.out``; the first failing rank of an attempt is the
    one whose exception submitit logged first, else the lowest rank with a traceback."""
    logs = JobLogs()
    errors: dict[int, list[tuple[str, int]]] = {}
    for err in sorted(folder.glob(f"{job_id}_*_log.err")):
        rank = int(err.name.removeprefix(f"{job_id}_").split("_")[0])
        for path in (err, err.with_suffix(".out")):
            for attempt, line in by_attempt(_read(path)):
                logs.add(attempt, rank, line)
                stamp = SUBMITIT_ERROR.match(line)
                if stamp or FAILURE.search(line):
                    errors.setdefault(attempt, []).append((stamp.group(1) if stamp else "~",
                                                           rank))
    logs.first_failing = {attempt: min(found)[1] for attempt, found in errors.items()}
    return logs


def sbatch_logs(folder: Path, job_id: str) -> JobLogs:
    """The rendered script's ``slurm-J.out`` and ``.err``; the first failing rank of an attempt
    is torchrun's first observed failure (the earliest over the nodes), else the rank whose
    traceback comes first in the file."""
    logs = JobLogs()
    for name in (f"slurm-{job_id}.out", f"slurm-{job_id}.err"):
        lines = list(by_attempt(_read(folder / name)))
        for attempt, line in lines:
            prefix = RANK_PREFIX.match(line)
            if name.endswith(".err") and MARKER.match(line):
                continue  # the attempt's header, already shown from .out
            if prefix:
                logs.add(int(prefix.group(1)), int(prefix.group(2)), line[prefix.end():])
                if FAILURE.search(line[prefix.end():]):
                    logs.first_failing.setdefault(int(prefix.group(1)), int(prefix.group(2)))
            else:
                logs.add(attempt, JOB, line)
        for attempt in {a for a, _ in lines}:
            text = "\n".join(line for a, line in lines if a == attempt)
            causes = sorted((stamp, int(rank)) for stamp, rank in ROOT_CAUSE.findall(text))
            if causes:
                logs.first_failing[attempt] = causes[0][1]
    return logs


def job_logs(folder: str | Path, job_id: str) -> JobLogs:
    """The logs of ``job_id`` in ``folder``: submitit's log folder (``RUN_DIR/submitit/J``,
    ``%j`` allowed) or the run directory of a rendered sbatch script."""
    path = Path(str(folder).replace("%j", job_id))
    if any(path.glob(f"{job_id}_*_log.err")):
        return submitit_logs(path, job_id)
    return sbatch_logs(path, job_id)

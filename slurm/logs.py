"""A Slurm job's logs, per attempt and per rank, for ``torchjob logs slurm:JOB_ID``.

The batch script appends every attempt of a job to ``RUN_DIR/slurm-J.out`` and ``.err`` (an
array task's: ``slurm-A_I.*``), each attempt after a marker line (``torchjob: NAME job J
attempt N ...``). Worker lines carry the one log prefix (``contract.LOG_PREFIX``); the job's
other lines (the batch shell, srun, the agents) are shown with node and rank ``-``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from torchjob.trainer.contract import CLOSING_RE, LOG_PREFIX, log_prefix

MARKER = re.compile(r"^torchjob: .*\bjob \S+ attempt (\d+)\b")
# the one prefix, as a pattern: "[node {node} rank {rank} attempt {attempt}] "
RANK_PREFIX = re.compile("^" + re.escape(LOG_PREFIX).replace(r"\{node\}", r"(?P<node>\S+)")
                         .replace(r"\{rank\}", r"(?P<rank>\d+)")
                         .replace(r"\{attempt\}", r"(?P<attempt>\d+)"))
# torchrun's report of a failed worker group: the rank that failed first on that node
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?time\s*: (\S+).*?"
                        r"rank\s*: (\d+)", re.S)
# the failing place in an agent's closing line (torchjob.trainer.failures.Failure.describe)
FAILING = re.compile(r"node (?P<node>\d+) rank (?P<rank>\d+) (?P<rest>.*)$")
FAILURE = re.compile(r"Traceback \(most recent call last\)|^trainer \[rank \d+\]: ")
JOB = "-"  # node and rank of the lines of the batch shell, srun and the torchrun agents


@dataclass
class JobLogs:
    """``lines[(attempt, rank or JOB)]`` with the node each rank ran on, and, per attempt with
    a failure, the rank that failed first."""

    lines: dict[tuple[int, int | str], list[str]] = field(default_factory=dict)
    nodes: dict[tuple[int, int], str] = field(default_factory=dict)
    first_failing: dict[int, int] = field(default_factory=dict)
    what: dict[int, str] = field(default_factory=dict)  # attempt -> what its first failure did
    files: list[Path] = field(default_factory=list)  # where the full logs are

    def add(self, attempt: int, source: int | str, line: str) -> None:
        self.lines.setdefault((attempt, source), []).append(line)

    def attempts(self) -> list[int]:
        return sorted({attempt for attempt, _ in self.lines})

    def formatted(self) -> Iterator[str]:
        """``[node N rank R attempt A] line``: attempt by attempt, rank by rank, then the job's
        own lines."""
        def order(key: tuple[int, int | str]) -> tuple[int, int, int]:
            attempt, source = key
            return (attempt, 1, 0) if isinstance(source, str) else (attempt, 0, source)

        for attempt, source in sorted(self.lines, key=order):
            node = self.nodes.get((attempt, source), JOB) if isinstance(source, int) else JOB
            prefix = log_prefix(node, source, attempt)
            for line in self.lines[(attempt, source)]:
                yield prefix + line


class LineReader:
    """One log file read as it grows: complete lines, each with its attempt (the last marker
    seen)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial, self.attempt = path, 0, b"", 0

    def read(self, *, final: bool = False) -> Iterator[tuple[int, str]]:
        """The lines appended since the last read; ``final``: a last line without newline too."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        if final and self.partial:
            complete, self.partial = [*complete, self.partial], b""
        for raw in complete:
            line = raw.decode(errors="replace")
            found = MARKER.match(line)
            if found:
                self.attempt = int(found.group(1))
            yield self.attempt, line


def shown(line: str, attempt: int, *, err: bool) -> str | None:
    """A log line as ``torchjob logs`` shows it: a worker's as written, with its prefix; any
    other with the job's prefix. The attempt's marker in ``.err`` repeats ``.out``'s: None."""
    if RANK_PREFIX.match(line):
        return line
    if err and MARKER.match(line):
        return None
    return log_prefix(JOB, JOB, attempt) + line


def log_files(folder: Path, job_id: str) -> tuple[Path, Path]:
    return folder / f"slurm-{job_id}.out", folder / f"slurm-{job_id}.err"


def job_logs(folder: str | Path, job_id: str) -> JobLogs:
    """The logs of ``job_id`` (an array task: ``A_I``) in the run directory ``folder``; the
    first failing rank of an attempt is torchrun's first observed failure (the earliest over
    the nodes), else the rank whose traceback comes first in the files."""
    logs = JobLogs()
    closing: dict[int, tuple[int, str, str]] = {}
    for path in log_files(Path(folder), job_id):
        logs.files.append(path)
        lines = list(LineReader(path).read(final=True))
        for attempt, line in lines:
            prefix = RANK_PREFIX.match(line)
            if path.suffix == ".err" and MARKER.match(line):
                continue  # the attempt's header, already shown from .out
            if prefix:
                at, rank, rest = int(prefix["attempt"]), int(prefix["rank"]), line[prefix.end():]
                logs.add(at, rank, rest)
                logs.nodes[(at, rank)] = prefix["node"]
                if FAILURE.search(rest):
                    logs.first_failing.setdefault(at, rank)
            else:
                logs.add(attempt, JOB, line)
                if (found := CLOSING_RE.search(line)) and (place := FAILING.match(found["what"])):
                    closing.setdefault(int(found["attempt"]),
                                       (int(place["rank"]), place["node"], place["rest"]))
        for attempt in {a for a, _ in lines}:
            text = "\n".join(line for a, line in lines if a == attempt)
            causes = sorted((stamp, int(rank)) for stamp, rank in ROOT_CAUSE.findall(text))
            if causes:
                logs.first_failing[attempt] = causes[0][1]
    for attempt, (rank, node, what) in closing.items():  # the agents' word is the last
        logs.first_failing[attempt] = rank
        logs.nodes[(attempt, rank)] = node
        logs.what[attempt] = what
    return logs


class Follower:
    """The logs of a job's tasks (one, or an array's) read as they grow, each line shown as
    ``torchjob logs`` shows it (an array task's with ``[A_I] `` in front)."""

    def __init__(self, folder: Path, tasks: Iterable[str]) -> None:
        tasks = list(tasks)
        self.readers = [(f"[{task}] " if len(tasks) > 1 else "", LineReader(path))
                        for task in tasks for path in log_files(folder, task)]

    def poll(self, *, final: bool = False) -> Iterator[str]:
        """The lines written since the last poll; ``final``: the job has ended, so a last
        line without a newline is complete too."""
        for label, reader in self.readers:
            for attempt, line in reader.read(final=final):
                text = shown(line, attempt, err=reader.path.suffix == ".err")
                if text is not None:
                    yield label + text


def first_failures(logs: JobLogs) -> Iterable[str]:
    """The closing lines: the rank that failed first in each attempt with a failure."""
    where = " and ".join(str(path) for path in logs.files if path.exists())
    for attempt, rank in sorted(logs.first_failing.items()):
        node = logs.nodes.get((attempt, rank), JOB)
        what = f": {logs.what[attempt]}" if attempt in logs.what else ""
        yield (f"torchjob: attempt {attempt}: first failing rank: {rank} (node {node}){what}"
               + (f"; full log: {where}" if where else ""))

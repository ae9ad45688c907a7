"""``--log-samples``: which dataset indices each rank trained on, to check a resume with.

Each attempt of each rank writes ``RUN_DIR/samples/attemptNNN-rankR.jsonl``: a header line,
then ``{"step": S, "epoch": E, "indices": [...]}`` per micro-batch; it changes nothing that is
trained. :func:`trained` reads them back, an attempt that resumed from step ``S`` replacing
what earlier ones recorded after ``S``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

from torchjob.trainer.checkpoint import Position
from torchjob.trainer.dist import Group, from_rank0

FOLDER = "samples"
NAME = re.compile(r"attempt(\d+)-rank(\d+)\.jsonl")


class SampleLog:
    """This rank's file for this attempt; one flushed line per micro-batch."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh: IO[str] = open(path, "w", buffering=1)  # line-buffered: a kill loses no line
        self.fh.write(json.dumps(header) + "\n")

    @classmethod
    def open(cls, run_dir: str, group: Group, start: Position) -> SampleLog:
        folder = Path(run_dir) / FOLDER
        attempt = from_rank0(1 + max((int(m[1]) for p in folder.glob("attempt*.jsonl")
                                      if (m := NAME.fullmatch(p.name))), default=0))
        return cls(folder / f"attempt{attempt:03d}-rank{group.rank}.jsonl",
                   {"attempt": attempt, "world_size": group.world_size, "rank": group.rank,
                    "resumed": start.__dict__})

    def write(self, step: int, epoch: int, indices: list[int]) -> None:
        self.fh.write(json.dumps({"step": step, "epoch": epoch, "indices": indices}) + "\n")

    def close(self) -> None:
        self.fh.close()


def trained(run_dir: Path) -> dict[int, list[int]]:
    """Per epoch, the dataset indices trained on by every rank of the attempts that count."""
    attempts: dict[int, list[Path]] = defaultdict(list)
    for path in sorted((run_dir / FOLDER).glob("attempt*.jsonl")):
        if m := NAME.fullmatch(path.name):
            attempts[int(m[1])].append(path)
    kept: list[dict[str, Any]] = []
    for attempt in sorted(attempts):
        lines = [json.loads(line) for path in attempts[attempt]
                 for line in path.read_text().splitlines() if line]
        since = lines[0]["resumed"]["step"]  # every file of an attempt starts at the same step
        kept = [r for r in kept if r["step"] <= since] + [r for r in lines if "step" in r]
    out: dict[int, list[int]] = defaultdict(list)
    for record in kept:
        out[record["epoch"]].extend(record["indices"])
    return dict(out)

"""The conformance matrix as a Markdown table (docs/conformance.md): scenario x backend, each
cell's outcome and seconds, and every declared cell's reason, numbered once."""

from __future__ import annotations

import datetime

from tests.conformance.matrix import COLUMNS, DECLARED, Outcome
from tests.conformance.scenarios import SCENARIOS

HEADER = """\
# Conformance matrix

Generated from a run of the whole matrix, {when}: `TORCHJOB_WRITE_CONFORMANCE=1
.venv/bin/python -m pytest tests/conformance` rewrites it; do not edit it by hand. Every cell
is a real run of `torchjob run --to BACKEND` on one 2-core machine (the Slurm columns on
`slurm/devcluster`, docker on podman; `k8s (pod contract)`: the PyTorchJob `torchjob run --to
k8s` submits, its pods run in podman as the operator would run them, `tests/k8s/pods.py`, as
no API server can run here), {workers} backend(s) at a time, {wall:.0f} s in all; the seconds
are each cell's own, from its first command to its last check. What each scenario checks:
`tests/conformance/scenarios.py`; the reasons below: `DECLARED` in `tests/conformance/matrix.py`.
"""


def table(found: dict[tuple[str, str], Outcome], wall: float, workers: int) -> str:
    reasons = list(dict.fromkeys(d.why for d in DECLARED.values()))
    backends = [c.backend for c in COLUMNS]
    lines = [HEADER.format(when=datetime.date.today().isoformat(), workers=workers, wall=wall),
             "| scenario | " + " | ".join(f"`{b}`" for b in backends) + " |",
             "|---" * (len(backends) + 1) + "|"]
    for scenario in SCENARIOS:
        row = [cell_text(found.get((scenario, b)), (scenario, b), reasons) for b in backends]
        lines.append(f"| {scenario} | " + " | ".join(row) + " |")
    lines.append("")
    lines += [f"{i}. {kind_of(why)}: {why}" for i, why in enumerate(reasons, 1)]
    return "\n".join(lines) + "\n"


def kind_of(why: str) -> str:
    return next(d.kind for d in DECLARED.values() if d.why == why)


def cell_text(outcome: Outcome | None, cell: tuple[str, str], reasons: list[str]) -> str:
    if outcome is None:
        return "not run"
    declared = DECLARED.get(cell)
    mark = f" ({reasons.index(declared.why) + 1})" if declared else ""
    if outcome.status in ("pass", "fail"):
        word = {"pass": "pass", "fail": "**FAIL**"}[outcome.status]
        if declared and outcome.status == "fail":
            word = declared.kind
        return f"{word}{mark}, {outcome.seconds:.0f} s"
    return f"{outcome.status}{mark}"

"""The conformance matrix: one test per cell (scenario x backend). The cells run before the
first of these tests (conftest.py: the backends side by side); each test reports its cell. A
declared cell (matrix.DECLARED) passes as declared: not run (n/a, pending) or run and still
failing (gap); a gap that passes fails its test, so that the declaration is removed."""

from __future__ import annotations

import pytest

from tests.conformance.matrix import COLUMNS, DECLARED, Outcome
from tests.conformance.scenarios import SCENARIOS

pytestmark = pytest.mark.integration

CELLS = [pytest.param((scenario, column.backend), id=f"{scenario}|{column.backend}",
                      marks=[getattr(pytest.mark, m) for m in column.marks])
         for scenario in SCENARIOS for column in COLUMNS]


@pytest.mark.parametrize("cell", CELLS)
def test_cell(cell: tuple[str, str], outcomes: dict[tuple[str, str], Outcome]) -> None:
    outcome, declared = outcomes[cell], DECLARED.get(cell)
    if declared is None:
        assert outcome.status == "pass", outcome.detail
    elif declared.kind == "gap":
        assert outcome.status == "fail", (
            f"{cell} passes: remove its declared gap from tests/conformance/matrix.py "
            f"({declared.why})")
        assert declared.fails_with in outcome.detail, outcome.detail
    else:
        assert outcome.status == declared.kind, outcome


def test_every_declaration_is_a_cell_and_says_why() -> None:
    cells = {(s, c.backend) for s in SCENARIOS for c in COLUMNS}
    assert set(DECLARED) <= cells, set(DECLARED) - cells
    for d in DECLARED.values():
        assert d.why.strip() and d.kind in ("n/a", "pending", "gap"), d
        assert bool(d.fails_with) == (d.kind == "gap"), d

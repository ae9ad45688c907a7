"""bench/scale.py end to end at 4 and 8 agents, both sides (the kit's own store, torch's
stock): the rows are there and their figures positive. Structure, never timings; every
process it starts is gone after it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture()
def scale(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv("TORCHJOB_BENCH_SCALE", "4,8")
    monkeypatch.setattr(sys, "argv", ["scale"])
    import scale
    monkeypatch.setattr(scale, "STATE_SIZES", (8, 64))
    return scale


def children() -> set[int]:
    """This process' children's pids, from /proc."""
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found.update(int(p) for p in (task / "children").read_text().split())
    return found


def test_both_sides_measure_every_figure_at_4_and_8_agents(scale) -> None:  # type: ignore[no-untyped-def]
    before = children()
    # a dead node is dropped after 4 s (1 s x 4): 2 s once dropped a live one on a loaded host
    fast = scale.Settings(keep_alive_s=1, max_attempt=4, last_call_s=1, steady_s=1.0,
                          phase_s=60.0)
    rows = scale.run(quick=True, settings=fast)
    assert children() <= before, "a store or host process outlived the benchmark"
    measures = {r["measure"]: r for r in rows}
    assert not [m for m in measures if "not measured" in m], rows
    for n in (4, 8):
        for end in ("group formed (median)", "store ops per agent to form",
                    "steady store ops per agent per keep-alive interval",
                    "RSS of the process serving the store", "client memory per agent",
                    "re-formed after one agent died (median)"):
            r = measures[f"{n} agents: {end}"]
            assert r["ours"] > 0 and r["baseline"] > 0 and r["ratio"] > 0, r
        verdict = measures[f"{n} agents: failure verdict exchange: store ops per agent"]
        assert 2 <= verdict["ours"] <= 10 and verdict["baseline"] is None, verdict
    assert measures["state of 64 nodes: one heartbeat write (one client)"]["ours"] > 0
    assert all({"benchmark", "measure", "ours", "baseline", "ratio", "goal", "unit"} <= set(r)
               for r in rows)

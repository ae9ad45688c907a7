"""``--profile FIRST:LAST`` (trainer.profiling): which steps a run profiles, resumed or not,
and the spans it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchjob.trainer.config import ConfigError, TrainConfig
from torchjob.trainer.profiling import StepProfiler


@pytest.mark.parametrize("text, steps", [("", None), ("3:5", (3, 5)), (" 1 : 1 ", (1, 1))])
def test_a_span_is_first_to_last_steps(text: str, steps: tuple[int, int] | None) -> None:
    assert TrainConfig(profile=text).profile_steps == steps


@pytest.mark.parametrize("text", ["5:3", "0:2", "3", "3:", "a:b", "-1:2", "3:5:7"])
def test_a_malformed_span_is_refused_at_the_start(text: str) -> None:
    with pytest.raises(ConfigError, match="--profile must be FIRST:LAST"):
        TrainConfig(profile=text)


def profiled_steps(tmp_path: Path, span: tuple[int, int], start_step: int, end: int
                   ) -> list[str]:
    """Run steps ``start_step + 1`` to ``end`` of a tiny model under a StepProfiler; the
    step regions its trace holds, in order."""
    said: list[str] = []
    profiler = StepProfiler(span, str(tmp_path), 0, torch.device("cpu"), said.append,
                            start_step=start_step, end_step=end)
    weight = torch.ones(4, requires_grad=True)
    for step in range(start_step + 1, end + 1):
        (weight * step).sum().backward()
        profiler.after(step)
    profiler.close()
    trace = tmp_path / "profile" / "rank0.json"
    if not trace.exists():
        assert not said
        return []
    assert said and said[0].startswith(f"profile of steps {span[0]}-{min(span[1], end)}")
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["name"] for e in sorted(events, key=lambda e: e.get("ts", 0))
            if e.get("name", "").startswith("ProfilerStep#")]


@pytest.mark.parametrize("start_step, end, steps", [
    (0, 8, [3, 4, 5]),  # from the start
    (3, 8, [4, 5]),  # resumed from step 3's checkpoint: the steps left of the span
    (0, 4, [3, 4]),  # the run ends first: what it has
    (0, 2, []),  # ends before it: nothing
    (6, 8, []),  # resumed past it: nothing
])
def test_the_steps_profiled(tmp_path: Path, start_step: int, end: int, steps: list[int]) -> None:
    assert profiled_steps(tmp_path, (3, 5), start_step, end) == \
        [f"ProfilerStep#{n}" for n in steps]

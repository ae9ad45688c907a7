"""bench/trace_summary.py on a trace shaped like a CUDA one (two steps, overlapping kernels, a
copy, a synchronising call, a compiled graph): the device's busy time counts overlaps once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import trace_summary  # noqa: E402


def event(name: str, cat: str, ts: float, dur: float) -> dict[str, object]:
    return {"name": name, "cat": cat, "ts": ts, "dur": dur, "ph": "X"}


EVENTS = [event("ProfilerStep#1", "user_annotation", 0, 10_000),
          event("ProfilerStep#2", "user_annotation", 10_000, 10_000),
          event("## Call CompiledFxGraph fabcdefghijklmnop ##", "cpu_op", 100, 500),
          event("cudaStreamSynchronize", "cuda_runtime", 9_000, 50),
          event("triton_mm", "kernel", 1_000, 4_000),
          event("triton_mm", "kernel", 3_000, 4_000),  # overlaps the first: 6 ms in all
          event("Memcpy HtoD", "gpu_memcpy", 12_000, 1_000),
          event("triton_red", "kernel", 15_000, 1_000)]


def test_device_busy_time_kernels_and_syncs_per_step() -> None:
    s = trace_summary.summary(EVENTS)
    assert s["steps"] == 2 and s["step_ms"] == pytest.approx(10.0)
    assert s["device_busy_ms"] == pytest.approx(4.0)  # (6 + 1 + 1) ms over 2 steps
    assert s["kernels_per_step"] == 1.5
    assert s["syncs"] == {"cudaStreamSynchronize": 1} and s["graphs"] == ["fabcdefghijk"]
    assert s["top"][0] == ("triton_mm", 8_000)
    shown = trace_summary.show("trainer", s)
    assert "device busy 4.00 ms (40%), 2 kernels per step" in shown


def test_a_file_that_is_no_profiler_trace_is_said_and_the_rest_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"traceEvents": EVENTS}))
    bad.write_text(json.dumps({"traceEvents": [event("x", "cpu_op", 0, 1)]}))
    assert trace_summary.main([f"a={bad}", f"b={good}"]) == 0
    out = capsys.readouterr().out
    assert "a: " in out and "no ProfilerStep# spans" in out and "b: 2 steps" in out
    assert trace_summary.main(["no-name"]) == 2

"""The README's main job, as a user runs it: `torchjob run jobs/examples/default.yaml`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.procs import ROOT, env_for_tests, torchjob

pytestmark = pytest.mark.integration


def test_default_job_reaches_95_percent_with_2_processes(tmp_path: Path) -> None:
    proc = torchjob("run", str(ROOT / "jobs/examples/default.yaml"), "--set",
                    f"run_dir={tmp_path}", env=env_for_tests(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["accuracy"] >= 0.95, summary
    assert summary["samples_per_s"] > 0
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"train", "eval"}
    # log lines carry the rank; both ranks joined
    assert "[rank 0/2]" in proc.stderr and "[rank 1/2]" in proc.stderr


def test_elastic_example_runs_two_local_nodes(tmp_path: Path) -> None:
    proc = torchjob("run", str(ROOT / "jobs/examples/elastic.yaml"), "--set",
                    f"run_dir={tmp_path}", "--set", "trainer.args.epochs=2", env=env_for_tests(),
                    timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["world_size"] == 4
    assert "[node 0 rank 0 attempt 0] " in out and "[node 1 rank 2 attempt 0] " in out

"""Metrics export in a real run (`torchjob run` of the default job, 2 processes): TensorBoard's
own reader reads the event files, the Prometheus file parses, a user's exporter named by dotted
path gets every record of metrics.jsonl, and a missing tensorboard package stops the job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.procs import ROOT, env_for_tests, torchjob, with_sitecustomize
from tests.trainer.test_exporters import parse_prom

pytestmark = pytest.mark.integration
SMALL = ["--set", "trainer.args.epochs=2", "--set", "trainer.args.log_every=5"]


class Recorder:
    """A user's exporter: each record, as a JSON line, to RUN_DIR/recorded.jsonl."""

    def start(self, run: Any) -> None:
        self.path = Path(run.run_dir) / "recorded.jsonl"
        self.path.write_text("")

    def record(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        with open(self.path, "a") as fh:
            fh.write('"closed"\n')


def test_tensorboard_prometheus_and_a_users_exporter(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, prom = tmp_path / "run", tmp_path / "prom"
    proc = torchjob("run", str(ROOT / "jobs/examples/default.yaml"), "--set", f"run_dir={run}",
                    "--set", "tensorboard=true", "--set", f"prometheus_dir={prom}", "--set",
                    "exporters=[tests.integration.test_metrics_export:Recorder]", *SMALL, env=env_for_tests(),
                    timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(train) >= 2 and len(evals) == 2

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/samples_per_s", "eval/loss",
            "eval/accuracy"} <= tags, tags
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in train]
    assert [e.step for e in events.Scalars("eval/accuracy")] == [r["step"] for r in evals]
    assert events.Scalars("eval/accuracy")[-1].value == pytest.approx(evals[-1]["accuracy"])

    got = parse_prom((prom / "torchjob_run_node0.prom").read_text())
    assert got["torchjob_step"] == ({"job": "run", "node": "0", "rank": "0"}, train[-1]["step"])
    assert got["torchjob_eval_accuracy"][1] == pytest.approx(evals[-1]["accuracy"])
    assert got["torchjob_restarts"][1] == 0 and got["torchjob_hangs"][1] == 0
    assert got["torchjob_samples_per_second"][1] > 0
    assert [p.name for p in prom.iterdir()] == ["torchjob_run_node0.prom"]

    recorded = [json.loads(line) for line in (run / "recorded.jsonl").read_text().splitlines()]
    assert recorded == [*records, "closed"]  # every record of rank 0, then close


def test_tensorboard_without_the_package_stops_at_the_start(tmp_path: Path) -> None:
    hidden = with_sitecustomize(tmp_path, "import sys\nsys.modules['tensorboard'] = None\n")
    proc = torchjob("run", str(ROOT / "jobs/examples/default.yaml"), "--set",
                    f"run_dir={tmp_path / 'run'}", "--set", "tensorboard=true", *SMALL,
                    env=env_for_tests(PYTHONPATH=hidden), timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "pip install torchjob[tensorboard]" in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

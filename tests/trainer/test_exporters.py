"""Metrics exporters (trainer.exporters, trainer.prometheus): the hook, the Prometheus text
file, and the refusals at the start. The real run's files: tests/integration/test_metrics_export."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from torchjob.trainer import exporters, ledger
from torchjob.trainer.config import ConfigError, parse_args
from torchjob.trainer.prometheus import Prometheus


def parse_prom(text: str) -> dict[str, tuple[dict[str, str], float]]:
    """A small text-format parser: name -> (labels, value); HELP and TYPE precede each."""
    out: dict[str, tuple[dict[str, str], float]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, rest = head.partition("{")
        assert lines[i - 2] == f"# HELP {name} " + lines[i - 2].split(" ", 3)[3]
        assert lines[i - 1] == f"# TYPE {name} gauge"
        pairs = [p.split("=", 1) for p in rest.rstrip("}").split(",") if p]
        out[name] = ({k: v.strip('"') for k, v in pairs}, float(value))
    return out


def run(tmp_path: Path, rank: int = 0, local_rank: int = 0, node: int = 0,
        run_id: str = "r1") -> exporters.Run:
    return exporters.Run(run_dir=str(tmp_path / "digits"), run_id=run_id, rank=rank,
                         local_rank=local_rank, node=node, world_size=4, config={"lr": 0.1})


def test_prometheus_file_has_the_records_restarts_and_last_hang(tmp_path: Path) -> None:
    folder = tmp_path / "digits"
    ledger.append(folder, "restart", run="r1")
    ledger.append(folder, "restart", run="old")  # another run of the directory: not counted
    ledger.append(folder, "hang", run="r1", culprits=[{"rank": 3, "node": "n2"}])
    prom = Prometheus(str(tmp_path / "prom"))
    prom.start(run(tmp_path, rank=2, local_rank=0, node=1))
    prom.record({"kind": "train", "time": 1000.5, "step": 10, "epoch": 0, "loss": 0.5,
                 "lr": 0.01, "samples_per_s": 250.0, "restart": 1})
    prom.record({"kind": "eval", "time": 1001.0, "step": 10, "epoch": 0, "loss": 0.4,
                 "accuracy": 0.9})
    files = list((tmp_path / "prom").iterdir())
    assert [f.name for f in files] == ["torchjob_digits_node1.prom"]  # no temporary left
    got = parse_prom(files[0].read_text())
    assert got["torchjob_step"] == ({"job": "digits", "node": "1", "rank": "2"}, 10)
    assert got["torchjob_train_loss"][1] == 0.5 and got["torchjob_learning_rate"][1] == 0.01
    assert got["torchjob_samples_per_second"][1] == 250.0
    assert got["torchjob_eval_loss"][1] == 0.4 and got["torchjob_eval_accuracy"][1] == 0.9
    assert got["torchjob_restarts"][1] == 1 and got["torchjob_hangs"][1] == 1
    labels, when = got["torchjob_last_hang_timestamp_seconds"]
    assert labels["culprit_rank"] == "3" and labels["culprit_node"] == "n2" and when > 1e9
    assert got["torchjob_last_update_timestamp_seconds"][1] == 1001.0


class Recorder:
    seen: list[Any] = []

    def start(self, run: exporters.Run) -> None:
        self.seen.append(("start", run.rank))

    def record(self, record: dict[str, Any]) -> None:
        self.seen.append(record)

    def close(self) -> None:
        self.seen.append("close")


class Broken(Recorder):
    def record(self, record: dict[str, Any]) -> None:
        raise RuntimeError("down")


def test_user_exporters_on_rank_0_only_and_a_broken_one_is_dropped(tmp_path: Path) -> None:
    Recorder.seen = []
    cfg = parse_args(["--exporters", f"{__name__}:Recorder, {__name__}:Broken"])
    said: list[str] = []
    assert exporters.build(cfg, run(tmp_path, rank=1, local_rank=1), said.append).exporters == []
    built = exporters.build(cfg, run(tmp_path), said.append)
    built.record({"kind": "train", "step": 1, "loss": 2.0})
    built.record({"kind": "train", "step": 2, "loss": 1.0})
    built.close()
    built.close()  # idempotent: the trainer closes on every way out
    records = [r for r in Recorder.seen if isinstance(r, dict)]
    assert [r["step"] for r in records] == [1, 2]
    assert Recorder.seen.count("close") == 1 and len(said) == 1 and "Broken" in said[0]


@pytest.mark.parametrize("path, why", [("nope_mod:X", "cannot import nope_mod"),
                                       (f"{__name__}:Missing", "has no Missing")])
def test_an_exporter_that_cannot_be_loaded_is_a_config_error(tmp_path: Path, path: str,
                                                              why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        exporters.build(parse_args(["--exporters", path]), run(tmp_path), print)


def test_exporters_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="not 'pkg.module:Class'"):
        parse_args(["--exporters", "just_a_module"])


def test_tensorboard_without_the_package_names_the_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard: ImportError
    with pytest.raises(ConfigError, match=r"pip install torchjob\[tensorboard\]"):
        exporters.build(parse_args(["--tensorboard", "true"]), run(tmp_path, rank=1), print)


def test_scalars_are_the_values_by_kind() -> None:
    assert exporters.scalars({"kind": "eval", "time": 1.0, "step": 3, "epoch": 0, "loss": 1,
                              "perplexity": 2.5, "note": "x", "ok": True}) == \
        {"eval/loss": 1.0, "eval/perplexity": 2.5}


def test_the_mlflow_example_logs_without_mlflow_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    fake = types.ModuleType("mlflow")
    fake.start_run = lambda **kw: calls.append(("start_run", kw))  # type: ignore[attr-defined]
    fake.log_params = lambda p: calls.append(("params", p))  # type: ignore[attr-defined]
    fake.log_metrics = lambda m, step: calls.append(("metrics", m, step))  # type: ignore
    fake.end_run = lambda: calls.append(("end_run",))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    cfg = parse_args(["--exporters",
                      "torchjob.jobs.examples.mlflow_exporter:MLflowExporter"])
    built = exporters.build(cfg, run(tmp_path), print)
    built.record({"kind": "train", "time": 1.0, "step": 5, "epoch": 0, "loss": 0.5, "lr": 0.1})
    built.close()
    assert calls[0] == ("start_run", {"run_name": "r1"}) and calls[1] == ("params", {"lr": 0.1})
    assert calls[2] == ("metrics", {"train_loss": 0.5, "train_lr": 0.1}, 5)
    assert calls[3] == ("end_run",)


def test_the_mlflow_example_without_mlflow_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    cfg = parse_args(["--exporters", "torchjob.jobs.examples.mlflow_exporter:MLflowExporter"])
    with pytest.raises(ConfigError, match="pip install mlflow"):
        exporters.build(cfg, run(tmp_path), print)

"""The trainer's output: a bar on a terminal, lines in logs, JSON metrics, summary and plot."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from torchjob.trainer.report import Reporter, read_metrics


def test_lines_in_logs_carry_the_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logging.getLogger("trainer.rank0").handlers.clear()
    rep = Reporter(str(tmp_path), rank=0, world_size=2, progress="lines", log_every=5)
    for step in range(1, 11):
        rep.progress(step, 10, loss=1.0 / step)
    err = capsys.readouterr().err
    assert "[rank 0/2] step 5/10 loss 0.2" in err and "step 10/10" in err
    assert "step 4/10" not in err


def test_bar_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rep = Reporter(str(tmp_path), rank=0, world_size=1, progress="bar", log_every=5)
    for step in range(1, 4):
        rep.progress(step, 3, loss=0.5)
    rep.close()
    assert "train: 100%" in capsys.readouterr().err


def test_only_rank_0_writes(tmp_path: Path) -> None:
    rep = Reporter(str(tmp_path / "r1"), rank=1, world_size=2, progress="lines", log_every=1)
    rep.metric("train", step=1, loss=1.0)
    rep.finish({"steps": 1})
    assert not (tmp_path / "r1").exists()


def test_metrics_summary_and_plot(tmp_path: Path) -> None:
    rep = Reporter(str(tmp_path), rank=0, world_size=1, progress="lines", log_every=1)
    for step in (1, 2, 3, 2, 3):  # a resumed run repeats steps 2 and 3
        rep.metric("train", step=step, loss=1.0 / step)
    rep.metric("eval", step=3, loss=0.3, accuracy=0.9)
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"kind": "train", "st')  # a line cut short by a kill
    rep.finish({"steps": 3, "accuracy": 0.9})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [("train", 1), ("train", 2),
                                                        ("eval", 3), ("train", 3)]
    assert json.loads((tmp_path / "summary.json").read_text())["accuracy"] == 0.9
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("damaged", [
    b"\xff\xfe",  # not UTF-8
    b'{"kind": "train", "step": "2", "loss": 0.5}',  # a step that is not a whole number
    b'{"kind": "train", "step": true, "loss": 0.5}',
    b'{"kind": ["train"], "step": 2, "loss": 0.5}',
    b'{"step": 2, "loss": 0.5}',
    b"[1, 2]",
])
def test_damaged_metrics_lines_are_left_out(tmp_path: Path, damaged: bytes) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(b'{"kind": "train", "step": 1, "loss": 1.0}\n'
                                             + damaged + b"\n")
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"kind": "train", "step": 1,
                                                         "loss": 1.0}]


def test_values_that_are_not_numbers_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "eval", "step": 1, "loss": null, "accuracy": "n/a", "ok": true, '
        '"perplexity": NaN, "epoch": 0}\n')
    [record] = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(record) == ["epoch", "kind", "perplexity", "step"]
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").mkdir()  # not a file: as if there were none
    assert read_metrics(tmp_path / "metrics.jsonl") == []

"""``torchjob report``: the run report's page from a run directory written by the trainer's and
the agent's own writers (metrics, per-rank step times, the ledger), without a browser (that is
tests/integration/test_run_report.py): axes from the data, the series, the heat map's cells
and stragglers, the restart and the hang with links to the stacks, the spec; bad input exits 2."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.procs import env_for_tests, torchjob
from torchjob.jobs import charts, report
from torchjob.trainer import ledger
from torchjob.trainer import report as trainer_report
from torchjob.trainer.report import Reporter
from torchjob.trainer.stragglers import percentiles

RUN = "job-1a2b3c"


T0 = 1_700_000_000.0  # the run's clock: step s at T0 + s, the hang and restart at T0 + 14


def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run of 2 ranks, rank 1 three times slower, one hang of rank 1 at step 12 and one
    restart from step 10; the records' times from a clock of its own."""
    folder = tmp_path / "runs" / "job"
    now = [T0]
    monkeypatch.setattr(trainer_report, "time", SimpleNamespace(time=lambda: now[0]))
    ranks = [Reporter(str(folder), rank=r, world_size=2, progress="lines", log_every=1)
             for r in (0, 1)]
    for step in [*range(1, 13), *range(11, 21)]:
        now[0] = T0 + step + (6 if now[0] >= T0 + 12 else 0)  # the resumed steps: later
        ranks[0].metric("train", step=step, epoch=0, loss=2.5 - 0.05 * step)
        for r, rep in enumerate(ranks):
            rep.step_times(step, 0, {"steps": 1, "p50_ms": 10.0 * (1 + 2 * r),
                                     "p90_ms": 0.0, "max_ms": 0.0})
        if step % 5 == 0:
            ranks[0].metric("eval", step=step, epoch=0, loss=2.0 - 0.01 * step,
                            accuracy=0.95 + 0.002 * step)
    ledger.append(folder, "round", run=RUN, round=0, nodes=["a:1", "b:2"], world_size=2,
                  attempt=0, checkpoint=None, time=iso(T0))
    ledger.append(folder, "hang", run=RUN, attempt=0, culprits=[
        {"rank": 1, "node": 1, "how": "its process is stopped (state T)",
         "frame": "train.py:42 in stuck_here"}], waiting="0", why="rank 1 stuck",
        time=iso(T0 + 14))
    ledger.append(folder, "restart", run=RUN, round=0, node="1 (b:2)", rank=1,
                  signal="SIGKILL", cause="node 1 rank 1 hung (last step 12)", attempt=0,
                  step=12, checkpoint="step_00000010", time=iso(T0 + 14))
    ledger.append(folder, "round", run=RUN, round=1, nodes=["a:1", "c:3"], world_size=2,
                  attempt=1, checkpoint="step_00000010", time=iso(T0 + 15))
    for r in (0, 1):
        stack = folder / "hangs" / "attempt0" / f"node{r}-rank{r}.txt"
        stack.parent.mkdir(parents=True, exist_ok=True)
        stack.write_text(f"rank {r}'s stack\n")
    return folder


def test_axes_are_zoomed_to_the_data() -> None:
    accuracy = charts.axis("accuracy", [0.95, 0.97, 0.99], bounds=(0.0, 1.0))
    assert 0.94 <= accuracy.lo < 0.95 and 0.99 < accuracy.hi <= 1.0
    assert len(accuracy.ticks) >= 3  # not one flat line at the top of a 0-1 axis
    loss = charts.axis("loss", [2.1, 2.4, 3.0])
    assert 2.0 < loss.lo < 2.1 and 3.0 < loss.hi < 3.1
    assert charts.axis("one", [5.0, 5.0]).lo < 5.0 < charts.axis("one", [5.0, 5.0]).hi


def test_the_page_shows_curves_step_times_restart_hang_and_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = run_dir(tmp_path, monkeypatch)
    html = report.write(folder).read_text()
    assert (folder / "report.html").is_file()
    series = dict(re.findall(r'data-series="([a-z-]+)" data-points="(\d+)"', html))
    assert series == {"train-loss": "20", "eval-loss": "4", "eval-accuracy": "4"}
    for rank in (0, 1):
        row = re.search(rf'data-series="step-time" data-rank="{rank}">(.*?)</g>', html)
        assert row is not None and row.group(1).count("data-ms=") >= 10
        assert row.group(1).count(": no steps<") >= 2  # the hang and restart: a gap
    assert 'data-stragglers="1"' in html and "rank 1 (slow)" in html
    hang = re.search(r'<li class="hang" data-event="hang" data-culprit-ranks="1">(.*?)</li>',
                     html)
    assert hang is not None and "train.py:42 in stuck_here" in hang.group(1)
    assert 'href="hangs/attempt0/node1-rank1.txt"' in hang.group(1).split(",")[0]
    assert html.count('data-event="restart"') == 1
    assert "a:1, b:2" not in html and "b:2 left; c:3 joined" in html
    assert html.count('data-marker="restart"') == 3  # on both curves and on the heat map
    assert not re.search(r"<script|<link|<img|src=|url\(|@import", html)  # nothing fetched


def test_the_cli_writes_it_and_refuses_bad_input(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = run_dir(tmp_path, monkeypatch)
    out = tmp_path / "elsewhere" / "r.html"
    out.parent.mkdir()
    done = torchjob("report", str(folder), "-o", str(out), env=env_for_tests())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert 'href="../runs/job/hangs/attempt0/node1-rank1.txt"' in out.read_text()
    (tmp_path / "empty").mkdir()
    for bad, said in ((tmp_path / "missing", "no such run directory"),
                      (tmp_path / "empty", "holds nothing of a run")):
        done = torchjob("report", str(bad), env=env_for_tests())
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_script_run_without_metrics_says_what_is_missing(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"state": "SUCCEEDED", "restarts": 0}))
    html = report.page(report.load(folder), folder)
    for part in ("curves", "step-time", "timeline"):
        assert f'data-empty="{part}"' in html


@pytest.mark.parametrize("times", [[], [0.01, 0.03]])
def test_each_rank_appends_its_step_times(tmp_path: Path, times: list[float]) -> None:
    """Every rank, not only rank 0, writes its own file (the run directory made if need be)."""
    rep = Reporter(str(tmp_path / "run"), rank=3, world_size=4, progress="lines", log_every=1)
    rep.step_times(7, 1, percentiles(times))
    record = json.loads((tmp_path / "run" / "step_times" / "rank3.jsonl").read_text())
    assert (record["step"], record["restart"], record["steps"]) == (7, 1, len(times))


TRAIN = b'{"kind": "train", "step": 1, "loss": 1.0}\n'
TRAINED = {"train-loss": "1", "eval-loss": "0"}  # its series on the page


def times(**fields: object) -> bytes:
    """A line of RUN_DIR/step_times/rank<R>.jsonl, at T0; ``fields`` override its own."""
    return json.dumps({"time": T0, "step": 1, "restart": 0, "steps": 1, "p50_ms": 10.0,
                       "p90_ms": 0.0, "max_ms": 0.0, **fields}).encode() + b"\n"


DAMAGED = {  # a run directory's files (None: a directory there), its series and heat map rows
    "not-utf8": ({"metrics.jsonl": TRAIN + b"\xff\xfe\n"}, TRAINED, []),
    "metrics-is-a-folder": ({"metrics.jsonl": None, "summary.json": b'{"steps": 1}'}, {}, []),
    "score-is-a-word": ({"metrics.jsonl": TRAIN + b'{"kind": "eval", "step": 1, "loss": 0.5, '
                         b'"accuracy": "n/a"}\n'}, {"train-loss": "1", "eval-loss": "1"}, []),
    "step-is-a-string": ({"metrics.jsonl": TRAIN + b'{"kind": "train", "step": "2", '
                          b'"loss": 0.5}\n'}, TRAINED, []),
    "nulls": ({"metrics.jsonl": TRAIN + b'{"kind": "train", "step": 2, "loss": null}\n'
               b'{"kind": "eval", "step": 2, "loss": 0.4, "accuracy": null}\n'},
              {"train-loss": "1", "eval-loss": "1"}, []),
    "created-not-a-time": ({"metrics.jsonl": TRAIN, ".torchjob/a/run.json": b'{"created": "x"}',
                            ".torchjob/b/run.json": b'{"created": [1]}',
                            ".torchjob/c/run.json": b'{"created": 1e300}'},
                           TRAINED, []),
    "sparse-ranks": ({"metrics.jsonl": TRAIN, "step_times/rank3.jsonl": times(),
                      "step_times/rank1000000.jsonl": times(p50_ms=30.0) + times(time="x")
                      + times(p50_ms=None) + times(time=float("nan")) + times(steps=True,
                                                                            time=True)},
                     TRAINED, ["3", "1000000"]),
}


@pytest.mark.parametrize(("files", "series", "ranks"), DAMAGED.values(), ids=list(DAMAGED))
def test_damaged_files_are_skipped_and_the_page_written(
        tmp_path: Path, files: dict[str, bytes | None], series: dict[str, str],
        ranks: list[str]) -> None:
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).mkdir() if data is None else (tmp_path / name).write_bytes(data)
    html = report.write(tmp_path, tmp_path / "out.html").read_text()
    assert dict(re.findall(r'data-series="([a-z-]+)" data-points="(\d+)"', html)) == series
    assert re.findall(r'data-rank="(\d+)"', html) == ranks
    assert ('data-stragglers="1000000"' in html) == bool(ranks)
    assert len(html) < 60_000  # a row per rank that has a file, not one per number below it

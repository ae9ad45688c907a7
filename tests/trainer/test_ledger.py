"""The run's ledger (trainer.ledger): restarts and membership rounds as JSON lines in the run
directory, the storm guard that stops a job whose restarts get nowhere, and the finished line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests
from torchjob.trainer import ledger

RUN = "job-1"


def restart(run: str, round_: int, mark: str | None, **extra: object) -> dict:
    return {"event": "restart", "run": run, "round": round_, "checkpoint": mark,
            "time": f"t{round_}", "cause": f"cause {round_}", **extra}


def test_stalled_counts_restarts_back_to_the_same_checkpoint_once_per_round() -> None:
    records = [restart(RUN, 0, "step_4"), restart(RUN, 1, "step_8"),
               restart(RUN, 2, "step_8"), restart(RUN, 2, "step_8"),  # two nodes, one restart
               restart("other-run", 3, "step_8"),  # another submission of the directory
               restart(RUN, 4, "step_8", membership=True),  # a node joined: no failure
               restart(RUN, 5, "step_8")]
    assert [r["round"] for r in ledger.stalled(records, RUN, "step_8")] == [1, 2, 5]
    assert ledger.stalled(records, RUN, "step_12") == []  # progress since: no storm
    assert ledger.stalled(records + [restart(RUN, 6, "step_12")], RUN, "step_12")[0]["round"] == 6


def test_the_storm_line_names_the_storm_and_the_last_causes() -> None:
    line = ledger.storm_line([restart(RUN, i, "step_8") for i in range(4)], "step_8")
    assert line.startswith("restart storm: 4 restarts in a row came back to checkpoint step_8")
    assert "cause 1; t2 cause 2; t3 cause 3" in line and "cause 0" not in line
    assert ledger.LEDGER in line


def test_membership_lists_who_left_and_joined_when_and_from_where() -> None:
    rounds = [
        {"event": "round", "run": RUN, "time": "t0", "nodes": ["a:1", "b:2"], "world_size": 4,
         "checkpoint": None},
        {"event": "restart", "run": RUN, "time": "t1", "checkpoint": "step_8", "step": 11},
        {"event": "round", "run": RUN, "time": "t2", "nodes": ["a:1"], "world_size": 2,
         "checkpoint": "step_8"},
        {"event": "round", "run": RUN, "time": "t3", "nodes": ["a:1", "c:3"], "world_size": 4,
         "checkpoint": "step_12"},
        {"event": "round", "run": "next", "time": "t4", "nodes": ["d:4"], "world_size": 2},
    ]
    assert ledger.membership(rounds, RUN) == [
        "b:2 left (noticed t1, at step 11): from t2 1 node(s), world size 2, from step_8",
        "c:3 joined (noticed t3): from t3 2 node(s), world size 4, from step_12"]
    assert ledger.membership(rounds) == []  # the last run in the ledger: one round, no change


def test_append_and_read_keep_whole_lines(tmp_path: Path) -> None:
    ledger.append(tmp_path, "restart", run=RUN, cause="x" * 10_000, **ledger.exit_fields(-9))
    ledger.append(tmp_path, "round", run=RUN, nodes=["h:1"])
    (tmp_path / ledger.LEDGER).open("a").write("not json\n")
    records = ledger.read(tmp_path)
    assert [r["event"] for r in records] == ["restart", "round"]
    assert records[0]["signal"] == "SIGKILL" and len(json.dumps(records[0])) < ledger.MAX_LINE
    assert ledger.exit_fields(1) == {"exit": 1} and ledger.exit_fields(137) == {
        "signal": "SIGKILL"}


def test_checkpoint_mark_names_the_newest_finished_checkpoint(tmp_path: Path) -> None:
    assert ledger.checkpoint_mark(tmp_path / "none") is None
    assert ledger.checkpoint_mark(tmp_path) is None
    for step in ("step_00000004", "step_00000008", "step_00000012"):
        (tmp_path / step).mkdir()
    for step in ("step_00000004", "step_00000008"):  # step 12 is still being written
        (tmp_path / step / "manifest.json").write_text("{}")
    assert ledger.checkpoint_mark(tmp_path) == "step_00000008"
    own = tmp_path / "own"
    own.mkdir()
    (own / "weights.pt").write_text("x")  # a script's own way: its newest file's time
    assert ledger.checkpoint_mark(own).startswith("modified ")


STORM = """\
import os, pathlib, signal
import torch.distributed as dist
dist.init_process_group("gloo")
ckpt = pathlib.Path(os.environ["TORCHJOB_CHECKPOINT_DIR"])
if dist.get_rank() == 0 and not ckpt.exists():  # a checkpoint once, then never again
    ckpt.mkdir(parents=True)
    (ckpt / "state.txt").write_text("step 5")
dist.barrier()
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # the same place on every attempt
dist.barrier()
"""


@pytest.mark.integration
def test_a_worker_dying_at_the_same_place_stops_as_a_storm(tmp_path: Path) -> None:
    script = tmp_path / "storm.py"
    script.write_text(STORM)
    run = tmp_path / "run"
    proc = subprocess.run(
        [PYTHON, "-m", "torchjob.trainer.agent", "--run-dir", str(run), "--checkpoint-dir",
         str(run / "ck"), "--max-stalled-restarts", "2", "--standalone", "--nproc-per-node",
         "2", "--max-restarts", "10", "--monitor-interval", "0.1", str(script)],
        env=env_for_tests(), capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    closing = [line for line in out.splitlines() if line.startswith("torchjob: the job failed")]
    assert closing and "restart storm: 2 restarts in a row came back to checkpoint" in \
        closing[-1], out[-3000:]
    records = ledger.read(run)
    restarts = [r for r in records if r["event"] == "restart"]
    assert [(r["rank"], r["signal"], r["attempt"]) for r in restarts] == [
        (1, "SIGKILL", 0), (1, "SIGKILL", 1)], records
    assert [r["event"] for r in records][-1] == "storm", records
    assert len({r["run"] for r in records}) == 1

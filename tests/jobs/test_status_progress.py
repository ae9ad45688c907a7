"""``torchjob status``'s progress (torchjob.jobs.progress): from a run directory (the trainer's
metrics, node 0's agent's progress.json, the ledger) and from a job's log lines (the one
progress-line format, trainer.report), the agent's count for a script (trainer.pace), the JSON
keys, and ``--watch`` off a terminal. Real runs: tests/integration/test_status_of_running_jobs.py and
the conformance matrix's kill row (every backend)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from torchjob.jobs import cli
from torchjob.jobs.backend import Handle, JobStatus, State
from torchjob.jobs.progress import Progress, from_logs, from_run_dir, from_stamped_logs
from torchjob.trainer import ledger
from torchjob.trainer.contract import (COUNTED, closing_line, counted_line, log_prefix,
                                       parse_counted)
from torchjob.trainer.hang import Seen
from torchjob.trainer.pace import PACE_S, PROGRESS_FILE, SAY_S, Pace
from torchjob.trainer.progress import Record
from torchjob.trainer.report import parse_eval, parse_progress, progress_line

WORKER = log_prefix(0, 0, 0) + "07:00:00 [rank 0/4] "


def test_the_progress_line_reads_back() -> None:
    line = progress_line(40, 100, {"loss": 0.51234, "lr": 0.001, "epoch": 1,
                                   "samples_per_s": 1234.5, "eta_s": 3725.4, "gone": None})
    assert line == "step 40/100 loss 0.5123 lr 0.001 epoch 1 samples/s 1234 eta 1:02:05"
    assert parse_progress("[node 1] " + WORKER + line) == {
        "step": 40, "total_steps": 100, "loss": 0.5123, "lr": 0.001, "epoch": 1.0,
        "samples_per_s": 1234.0, "eta_s": 3725.0}
    assert parse_eval(WORKER + "eval at step 40: loss 0.2140 accuracy 0.9400") == {
        "loss": 0.214, "accuracy": 0.94, "step": 40}
    assert parse_eval("eval after epoch 2: loss 0.2140") == {"loss": 0.214}
    for other in ("step 4 of 10", "training 880 steps (22/epoch)", "a step 3/4 odd tail x",
                  "eval: nothing"):
        assert parse_progress(other) is None and parse_eval(other) is None, other


def test_from_logs_the_last_figures_restarts_and_the_hangs_culprit() -> None:
    hang = ("torchjob: hang on node 1: rank 3 on node 1 (sleeping in hrtimer_nanosleep; at "
            "train.py:27 in sleep_here) 1 collective(s) behind the others: no progress for 5 s;"
            " waiting for it: rank(s) 0, 1, 2; killing its workers, to restart them")
    lines = [
        "[node 0] " + WORKER + progress_line(10, 40, {"loss": 0.9, "eta_s": 30}),
        "[node 0] " + WORKER + "eval at step 10: loss 0.8000 accuracy 0.5000",
        "[node 1] W1127 03:58:37.135000 31615 trainer/torchrun_agent.py:256] " + hang,
        "[node 1] W1127 torchjob: node 1 rank 3 hung (last step 4): restarting the workers",
        "[node 0] W1127 torchjob: another node: node 1 rank 3 hung: restarting the workers",
        "[node 0] " + log_prefix(0, 0, 1) + "resumed from step_00000008",
        "[node 0] " + log_prefix(0, 0, 1) + progress_line(20, 40, {"loss": 0.5, "epoch": 2,
                                                                   "eta_s": 12}),
    ]
    told = from_logs(lines)
    assert told == Progress(step=20, total_steps=40, epoch=2, loss=0.5, eval={
        "loss": 0.8, "accuracy": 0.5}, eval_step=10, eta=12.0, restarts=1,
        culprit="hang: rank 3 on node 1 (sleeping in hrtimer_nanosleep; at train.py:27 in "
                "sleep_here) 1 collective(s) behind the others: no progress for 5 s; waiting "
                "for it: rank(s) 0, 1, 2", source="logs")
    # a later failure of another kind replaces it; the first-hand closing line names the job's
    later = lines + ["[node 0] torchjob: node 0 rank 1 exited with code -9 (SIGKILL): "
                     "restarting the workers"]
    assert from_logs(later).culprit == "node 0 rank 1 exited with code -9 (SIGKILL)"  # type: ignore
    closed = later + ["[node 1] " + closing_line("stopping: node 0 rank 1 raised", 2, 1),
                      "[node 0] " + closing_line("node 0 rank 1 raised ValueError: x", 2, 1)]
    assert from_logs(closed).culprit == "node 0 rank 1 raised ValueError: x"  # type: ignore
    assert from_logs(["hello", "world"]) is None


def test_stamped_logs_age_the_eta_from_when_its_line_was_written() -> None:
    """Lines with when they were written (Kubernetes' stamps): the newest figure's time is
    ``updated``; the ETA, said on its progress line, is made as of it, and ages from it."""
    lines = [(1000.0, "[node 0] " + WORKER + progress_line(10, 40, {"eta_s": 100})),
             (1030.0, "[node 0] " + WORKER + "eval at step 10: loss 0.8000 accuracy 0.5000"),
             (None, "[node 0] W1127 torchjob: the agent says hello")]
    told = from_stamped_logs(lines)
    assert told is not None and (told.updated, told.eta) == (1030.0, 70.0), told
    assert told.now(1050.0, running=True).eta == 50.0
    assert "(updated 20 s ago)" in told.now(1050.0, running=True).lines(1050.0)[0]


def metrics(run_dir: Path, *records: dict) -> None:
    with open(run_dir / "metrics.jsonl", "a") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")


def test_from_a_run_directory_only_this_jobs_lines(tmp_path: Path) -> None:
    now = time.time()
    metrics(tmp_path, {"kind": "train", "time": now - 600, "step": 99, "total_steps": 99},
            {"kind": "train", "time": now - 2, "step": 30, "total_steps": 100, "epoch": 1,
             "loss": 0.25, "samples_per_s": 900.0, "eta_s": 70.0, "restart": 1},
            {"kind": "eval", "time": now - 1, "step": 30, "epoch": 1, "loss": 0.3,
             "accuracy": 0.9})
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"kind": "train", "ti')  # a line cut by a kill
    ledger.append(tmp_path, "restart", run="old", cause="long ago")
    ledger.append(tmp_path, "round", run="new", round=0)
    ledger.append(tmp_path, "restart", run="new", round=0,
                  cause="node 0 rank 1 exited with code -9")
    ledger.append(tmp_path, "restart", run="new", round=0, membership=True,
                  cause="a change of membership")  # the other node's line of that restart
    told = from_run_dir(tmp_path, since=now - 60)
    assert told is not None and told.source == str(tmp_path)
    assert (told.step, told.total_steps, told.epoch, told.loss, told.samples_per_s,
            told.eta, told.eval, told.eval_step) == (30, 100, 1, 0.25, 900.0, 70.0,
                                                     {"loss": 0.3, "accuracy": 0.9}, 30)
    assert (told.restarts, told.culprit) == (1, "node 0 rank 1 exited with code -9")
    assert told.updated == pytest.approx(now - 2, abs=0.01)
    ledger.append(tmp_path, "hang", run="new", culprits=[{"rank": 3, "node": 1,
                                                          "how": "stopped", "frame": "x"}])
    assert from_run_dir(tmp_path, since=now - 60).culprit == \
        "hang: rank 3 on node 1 (stopped)"  # type: ignore[union-attr]
    (tmp_path / "summary.json").write_text(json.dumps({
        "state": "FAILED", "failure": "node 0 rank 1 raised ValueError: x: not retried"}))
    assert from_run_dir(tmp_path, since=now - 60).culprit == \
        "node 0 rank 1 raised ValueError: x: not retried"  # type: ignore[union-attr]
    assert from_run_dir(tmp_path / "nothing") is None


def test_a_script_counted_by_its_agent(tmp_path: Path) -> None:
    """No metrics: node 0's agent's progress.json gives the step, the pace, and an ETA when
    the script told its total (progress.step(n, total=T))."""
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({
        "time": time.time(), "step": 40, "attempt": 0, "total_steps": 100,
        "steps_per_s": 2.0}))
    told = from_run_dir(tmp_path)
    assert told is not None
    assert (told.step, told.total_steps, told.steps_per_s, told.eta) == (40, 100, 2.0, 30.0)
    # the trainer's ETA, as of its line, counts when the agent's newer count has no pace yet
    now = time.time()
    metrics(tmp_path, {"kind": "train", "time": now - 3, "step": 10, "total_steps": 100,
                       "eta_s": 50.0})
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({"time": now, "step": 12, "attempt": 0,
                                                      "total_steps": 100}))
    told = from_run_dir(tmp_path)
    assert told is not None and (told.step, told.eta) == (12, pytest.approx(47.0, abs=0.01))


def seen(rank: int, **record: int) -> Seen:
    worker = Seen(local_rank=rank, rank=rank, pid=1, started=0.0)
    worker.record = Record(**record)  # type: ignore[arg-type]
    return worker


def test_the_agents_count(tmp_path: Path) -> None:
    """The slowest rank's step (progress.step, else optimizer steps counted), its pace since
    the attempt's first count, the total; rewritten every PACE_S, once more at the end; said
    in the log every SAY_S when it moved, and at the end, in words status reads back."""
    said: list[str] = []
    pace = Pace(tmp_path, say=said.append)
    assert pace.tell([seen(0), seen(1, step=-1)], 0, 0.0) is None  # nothing counted yet
    first = pace.tell([seen(0, step=10, total=50), seen(1, optimizer_steps=8)], 0, 1.0)
    assert first is not None and (first["step"], first["total_steps"]) == (8, 50)
    assert pace.tell([seen(0, step=12), seen(1, optimizer_steps=12)], 0, 2.0) is None
    later = pace.tell([seen(0, step=18), seen(1, optimizer_steps=18)], 0, 1.0 + PACE_S)
    assert later is not None and later["steps_per_s"] == pytest.approx(10 / PACE_S, abs=1e-3)
    assert json.loads((tmp_path / PROGRESS_FILE).read_text()) == later
    ended = pace.tell([seen(0, step=19)], 0, 2.0 + PACE_S, last=True)
    assert ended is not None and ended["step"] == 19
    restarted = pace.tell([seen(0, step=5)], 1, 3.0 + 2 * PACE_S)
    assert restarted is not None and (restarted["attempt"], restarted["steps_per_s"]) == (1, None)
    assert said == [f"{COUNTED}8 of 50", f"{COUNTED}19, 1.833 steps/s"]  # (19 - 8) / 6 s
    assert pace.tell([seen(0, step=6)], 1, SAY_S) is not None and len(said) == 2
    assert pace.tell([seen(0, step=7)], 1, 8.0 + SAY_S) is not None  # SAY_S after the last
    assert said[2] == f"{COUNTED}7, 0.08 steps/s"  # (7 - 5) / 25 s
    assert pace.tell([seen(0, step=7)], 1, 10.0 + SAY_S, last=True) and len(said) == 3
    told = from_logs(f"[node 0] W1130 12:00:00.000 7 agent.py:9] {line}" for line in said)
    assert told is not None and (told.step, told.total_steps, told.steps_per_s) == (7, None, 0.08)
    # with the total a script told: the ETA from the pace
    told = from_logs(["[node 0] W1130 a.py:1] torchjob: steps counted: 40 of 100, 2.5 steps/s"])
    assert told is not None and (told.step, told.total_steps, told.eta) == (40, 100, 24.0)
    # no run directory (a pod without one): the log alone
    nowhere = Pace(None, say=said.append).tell([seen(0, step=3)], 0, 0.0)
    assert nowhere is not None and nowhere["step"] == 3 and said[-1] == f"{COUNTED}3"


def test_the_agents_count_line_reads_back_in_every_form() -> None:
    for step, total, pace in ((5, None, None), (40, 100, 2.5), (3, None, 1e-05),
                              (1, 5, 12345.6)):
        told = parse_counted(f"[node 0] W1130 a.py:1] {counted_line(step, total, pace)}\n")
        assert told is not None and (told["step"], told["total_steps"]) == (step, total)
        assert told["steps_per_s"] == (pytest.approx(pace, rel=1e-3) if pace else None)
    assert parse_counted(f"{COUNTED}5, 1.2.3 steps/s") is None


def test_the_trainers_lines_and_the_agents_count_in_one_log() -> None:
    """The trainer's figures stay; the step is the newer of its line and the agent's count."""
    trainer = "[node 0 rank 0 attempt 0] step 40/100 loss 0.5 samples/s 100"
    told = from_logs([trainer, f"[node 0] {COUNTED}44 of 100"])
    assert told is not None and (told.step, told.total_steps, told.loss, told.steps_per_s) \
        == (44, 100, 0.5, None)
    told = from_logs([f"[node 0] {COUNTED}44 of 100", trainer])
    assert told is not None and told.step == 40


def test_in_words_and_as_json() -> None:
    told = Progress(step=40, total_steps=100, epoch=1, samples_per_s=1234.0, loss=0.25,
                    eval={"accuracy": 0.9}, eval_step=30, eta=20.0, restarts=1,
                    culprit="node 0 rank 1 exited", updated=100.0, source="runs/x")
    assert told.now(105.0, running=True).eta == 15.0
    assert told.now(200.0, running=True).eta == 0.0
    assert told.now(105.0, running=False).eta is None
    assert told.now(105.0, running=True).lines(105.0) == [
        "progress: step 40/100 (40%), epoch 1, 1234 samples/s, ETA 0:00:15 (updated 5 s ago)",
        "loss 0.25; eval at step 30: accuracy 0.9",
        "restarts: 1; the last failure: node 0 rank 1 exited"]
    handle = Handle("local", "digits-1")
    with_it = JobStatus(handle, State.RUNNING, progress=told).as_json()
    assert (with_it["step"], with_it["total_steps"], with_it["eta"], with_it["restarts"],
            with_it["progress_source"]) == (40, 100, 20.0, 1, "runs/x")
    without = JobStatus(handle, State.PENDING).as_json()
    assert {k: without[k] for k in ("step", "total_steps", "eta", "progress_source")} == \
        dict.fromkeys(("step", "total_steps", "eta", "progress_source"))


def test_an_arrays_tasks_each_have_theirs(tmp_path: Path) -> None:
    """A Slurm array (a sweep): each task's progress from its point's run directory, named by
    the first line of its output; the array's is its tasks'."""
    from torchjob.slurm.backend import point_dir
    from torchjob.slurm.sbatch import SWEEP_POINT_LINE
    (tmp_path / "slurm-7_0.out").write_text(
        f"torchjob: digits job 7_0\n{SWEEP_POINT_LINE}0: lr=1\n")
    (tmp_path / "slurm-7_1.out").write_text(f"{SWEEP_POINT_LINE}1: ../../etc\n")

    def of(task: str) -> str:
        return point_dir(JobStatus(Handle("slurm", task), State.RUNNING, run_dir=str(tmp_path)))
    assert of("7_0") == str(tmp_path / "lr=1")
    assert of("7_1") == of("7_2") == str(tmp_path)  # not a label; no output yet
    assert of("7") == str(tmp_path)  # the array itself
    told = Progress(tasks={"7_0": Progress(step=3, total_steps=6, eta=30.0, updated=100.0),
                           "7_1": Progress()})
    assert told.now(110.0, running=True).lines(110.0) == [
        "7_0: progress: step 3/6 (50%), ETA 0:00:20 (updated 10 s ago)",
        "7_1: no progress yet"]
    shown = JobStatus(Handle("slurm", "7"), State.RUNNING, progress=told).as_json()
    assert shown["step"] is None and shown["tasks"]["7_0"]["step"] == 3


def test_watch_off_a_terminal_prints_each_change_until_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handle = Handle("local", "digits-1")
    shown = iter([JobStatus(handle, State.RUNNING, progress=Progress(step=1, updated=1.0)),
                  JobStatus(handle, State.RUNNING, progress=Progress(step=1, updated=1.0)),
                  JobStatus(handle, State.RUNNING, progress=Progress(step=2, updated=1.0)),
                  JobStatus(handle, State.SUCCEEDED, exit_code=0)])
    monkeypatch.setattr(cli.api, "status", lambda *a, **k: next(shown))
    monkeypatch.setattr(cli, "WATCH_S", 0.0)
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    assert cli.main(["status", "--watch", "local:digits-1"]) == 0
    heads = [line for line in out.getvalue().splitlines() if line.startswith("local:")]
    assert heads == ["local:digits-1: RUNNING"] * 2 + ["local:digits-1: SUCCEEDED (exit code 0)"]
    assert "progress: step 2" in out.getvalue()

"""``torchjob submit --to slurm`` through submitit, on the real local cluster.

The default job on 2 nodes x 2 tasks; a job stopped by SIGUSR2 (what Slurm sends
``signal_delay`` seconds before the time limit) that checkpoints, is requeued, resumes and
finishes with every step logged once; the requeue budget and the no-progress stop; bad input
that stops before anything is queued.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from jobs.load import load
from jobs.spec import JobSpec
from slurm import slurm_cli
from slurm.slurm_cli import SlurmError
from slurm.slurm_logs import job_logs
from slurm.submitit_job import (RequeueRefused, TrainTask, extra_parameters, submit,
                                submit_sweep, submitit_parameters, timeout_minutes)
from tests.procs import (PYTHON, ROOT, env_for_tests, last_step, linger_at_exit, lingering,
                         wait_for)
from tests.slurm.conftest import TWO_BY_TWO_SETS, assert_same_result

if TYPE_CHECKING:
    from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

DEFAULT = ROOT / "jobs" / "examples" / "default.yaml"
SLURM_COMMANDS = ("sbatch", "srun", "sinfo", "squeue", "sacct", "scancel", "scontrol")


def job_spec(run_dir: Path, *overrides: str) -> JobSpec:
    """The default example on 2 nodes x 2 tasks; batch 16 per rank = 2 x 32 of `torchjob run`."""
    name = f"sj-{uuid.uuid4().hex[:8]}"
    return load(DEFAULT, [f"name={name}", "nnodes=2", "trainer.args.batch_size=16",
                          f"run_dir={run_dir}", "env.OMP_NUM_THREADS=1", *overrides])


def train_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if row.get("kind") == "train"]


def task_logs(run_dir: Path, job_id: str, rank: int = 0) -> str:
    return slurm_cli.task_logs(run_dir / "submitit" / "%j", job_id).get(rank, "")


def skip_requeue_delay(job_id: str, stop: threading.Event) -> None:
    """Slurm holds a requeued job for ~2 minutes (reason BeginTime); start it now instead."""
    while not stop.wait(0.5):
        out = slurm_cli.run(["squeue", "-h", "-j", job_id, "-o", "%r"]).stdout
        if "BeginTime" in out:
            slurm_cli.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])


# -- the pure part ------------------------------------------------------------------------------

def test_parameters_follow_the_spec(tmp_path: Path) -> None:
    spec = load(DEFAULT, ["nnodes=1:3", "nproc_per_node=4", "resources.cpu=8",
                          "resources.memory=6Gi", "resources.gpus=2", "slurm.partition=p",
                          "slurm.account=acc", "slurm.qos=high", "slurm.constraint=ib",
                          "slurm.time=01:30:20", "slurm.exclusive=true",
                          "slurm.signal_delay=45", f"run_dir={tmp_path}"])
    spec = dataclasses.replace(spec, slurm=dataclasses.replace(
        spec.slurm, extra_flags=("--gres=gpu:2", "--requeue")))
    assert submitit_parameters(spec) == {
        "name": "digits", "nodes": 3, "tasks_per_node": 4, "timeout_min": 91,
        "slurm_signal_delay_s": 45, "cpus_per_task": 2, "gpus_per_node": 2,
        "slurm_mem": "6144M", "slurm_partition": "p", "slurm_account": "acc",
        "slurm_qos": "high", "slurm_constraint": "ib", "slurm_exclusive": True,
        "slurm_additional_parameters": {"gres": "gpu:2", "requeue": True}}
    assert [timeout_minutes(t) for t in ("5", "00:00:30", "1-00:00:00", None)] == \
        [5, 1, 1440, 60]
    with pytest.raises(ValueError, match=r"extra_flags\[0\].*--name=value"):
        extra_parameters(["-w n1"])


# -- running jobs -------------------------------------------------------------------------------

def test_default_job_on_two_nodes_by_two_tasks(slurm_cluster: SlurmCluster, tmp_path: Path,
                                               local_two_by_two: dict[str, float]) -> None:
    """The default job through submitit (one Slurm task per rank, no torchrun) ends exactly
    where ``torchjob run`` of the same job (2 nodes x 2, same seed and global batch) ends."""
    run_dir = tmp_path / "run"
    job_id = submit(job_spec(run_dir, *TWO_BY_TWO_SETS))
    assert slurm_cli.wait(job_id, timeout=300) == "COMPLETED", task_logs(run_dir, job_id)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4
    assert summary["accuracy"] >= 0.95
    logs = slurm_cli.task_logs(run_dir / "submitit" / "%j", job_id)
    assert sorted(logs) == [0, 1, 2, 3]
    assert "from slurm" in logs[3]  # each rank reads SLURM_* itself: no torchrun
    assert_same_result(summary, local_two_by_two)


@pytest.mark.parametrize("interrupt", [
    ["scancel", "--signal=USR2"],  # what Slurm sends signal_delay s before the limit
    ["scontrol", "requeue"],  # by hand: Slurm stops the tasks with SIGTERM and requeues
])
def test_interrupted_job_checkpoints_requeues_and_resumes(
        slurm_cluster: SlurmCluster, tmp_path: Path, interrupt: list[str]) -> None:
    run_dir = tmp_path / "run"
    spec = job_spec(run_dir, "trainer.args.epochs=30", "trainer.args.log_every=1",
                    "trainer.args.checkpoint_every=0")
    job_id = submit(spec)
    stop = threading.Event()
    helper = threading.Thread(target=skip_requeue_delay, args=(job_id, stop), daemon=True)
    helper.start()
    try:
        wait_for(lambda: last_step(run_dir) >= 40, 180, "40 steps")
        assert slurm_cli.run([*interrupt, job_id]).returncode == 0
        assert slurm_cli.wait(job_id, timeout=300) == "COMPLETED", task_logs(run_dir, job_id)
    finally:
        stop.set()
        helper.join()
    log = task_logs(run_dir, job_id)
    signal = "SIGUSR2" if "scancel" in interrupt else "SIGTERM"
    assert f"stopped by {signal} after step" in log and "checkpoint written" in log, log
    assert "torchjob: requeue 1 of 3 from checkpoint step" in log, log
    assert "resumed from step_" in log and "RequeueRefused" not in log, log
    assert train_steps(run_dir) == list(range(1, 661)), "a step was lost or repeated"
    assert json.loads((run_dir / "summary.json").read_text())["accuracy"] >= 0.95
    # every rank's appended files, split into the two attempts
    shown = job_logs(run_dir / "submitit" / "%j", job_id)
    assert shown.attempts() == [0, 1] and not shown.first_failing, shown.first_failing
    assert sorted(source for _, source in shown.lines) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert any(f"stopped by {signal} after step" in line for line in shown.lines[(0, 0)])
    assert not any("resumed from" in line for line in shown.lines[(0, 0)])
    for (attempt, rank), lines in shown.lines.items():  # submitit's start line included
        assert sum("Starting with JobEnvironment" in line for line in lines) == 1, lines[:5]
        assert f"torchjob: job {job_id} attempt {attempt} rank {rank}" in lines
    assert any("resumed from step_" in line for line in shown.lines[(1, 0)])


def test_time_limit_shorter_than_the_work(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A 1-minute limit for about two minutes of training (2640 steps at ~30 steps/s here;
    one run with 60 epochs finished inside the limit): Slurm's own USR2 (``--signal
    USR2@10``, which Slurm may send up to ~30 s early) stops each attempt at a checkpoint and
    the job is requeued until the work is done; nothing is sent by the test."""
    run_dir = tmp_path / "run"
    spec = job_spec(run_dir, "trainer.args.epochs=120", "trainer.args.log_every=1",
                    "trainer.args.checkpoint_every=0", "slurm.time=1", "slurm.signal_delay=10",
                    "slurm.max_requeues=8")
    job_id = submit(spec)
    stop = threading.Event()
    helper = threading.Thread(target=skip_requeue_delay, args=(job_id, stop), daemon=True)
    helper.start()
    try:
        assert slurm_cli.wait(job_id, timeout=900) == "COMPLETED", task_logs(run_dir, job_id)
    finally:
        stop.set()
        helper.join()
    log = task_logs(run_dir, job_id)
    assert "stopped by SIGUSR2" in log and "Requeued job" in log, log
    assert train_steps(run_dir) == list(range(1, 120 * 22 + 1)), "a step was lost or repeated"


def test_a_stop_signal_while_the_finished_tasks_exit_changes_nothing(
        slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm sends the time-limit USR2 up to ~40 s early, so it can land as the last attempt's
    tasks exit (a CI run saw it: two tasks died of it and the finished job ended FAILED).
    Here every task holds its exit open and gets USR2 there: the job ends COMPLETED, and
    submitit's handler, back after the trainer, does not requeue the finished job."""
    window = tmp_path / "exiting"
    window.mkdir()
    for key, value in linger_at_exit(window, 6).items():
        monkeypatch.setenv(key, value)  # sbatch exports the submitting environment to tasks
    run_dir = tmp_path / "run"
    job_id = submit(job_spec(run_dir, "trainer.args.epochs=2"))
    wait_for(lambda: len(lingering(window)) == 4 or not slurm_cli.in_queue(job_id), 300,
             "all 4 tasks exiting")
    try:
        assert slurm_cli.run(["scancel", "--signal=USR2", job_id]).returncode == 0
        assert slurm_cli.wait(job_id, timeout=120) == "COMPLETED", task_logs(run_dir, job_id)
    finally:
        slurm_cli.run(["scancel", job_id])  # a finished job requeued by the signal: gone
    assert len(lingering(window)) == 4
    shown = job_logs(run_dir / "submitit" / "%j", job_id)
    assert shown.attempts() == [0] and not shown.first_failing, shown.first_failing
    assert "Caught signal" not in task_logs(run_dir, job_id)


def test_a_failing_job_names_its_first_failing_rank(slurm_cluster: SlurmCluster,
                                                    tmp_path: Path) -> None:
    """A batch too big for a rank's share of the data: every rank stops with a configuration
    error (exit 2, not requeued), and the logs name a failing rank."""
    run_dir = tmp_path / "run"
    job_id = submit(job_spec(run_dir, "trainer.args.batch_size=1000"))
    assert slurm_cli.wait(job_id, timeout=300) == "FAILED"
    shown = job_logs(run_dir / "submitit" / "%j", job_id)
    assert shown.attempts() == [0] and shown.first_failing == {0: 0}, shown.first_failing
    for rank in range(4):
        assert any(f"trainer [rank {rank}]: one optimizer step needs 1000 samples" in line
                   for line in shown.lines[(0, rank)]), shown.lines[(0, rank)]


# -- requeue decisions (in-process, on a real checkpoint) ---------------------------------------

@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir whose newest checkpoint is step 3 (one local process, a few seconds)."""
    run_dir = tmp_path_factory.mktemp("ckpt")
    subprocess.run([PYTHON, "-m", "trainer", "--max-steps", "3", "--run-dir", str(run_dir),
                    "--progress", "lines"], check=True, capture_output=True, timeout=120,
                   env=env_for_tests(), cwd=ROOT)
    return run_dir


def test_requeue_carries_its_count_and_stops_without_progress(checkpointed: Path) -> None:
    task = TrainTask(argv=(), env={}, checkpoint_dir=str(checkpointed / "checkpoints"),
                     max_requeues=3)
    first = task.checkpoint()
    assert (first.function.requeues, first.function.last_step) == (1, 3)
    with pytest.raises(RequeueRefused, match="no progress since the last requeue.*step 3"):
        first.function.checkpoint()


def test_requeue_budget_is_bounded(checkpointed: Path) -> None:
    task = TrainTask(argv=(), env={}, checkpoint_dir=str(checkpointed / "checkpoints"),
                     max_requeues=2, requeues=2, last_step=1)
    with pytest.raises(RequeueRefused, match="requeued 2 time.*max_requeues is 2"):
        task.checkpoint()


# -- bad input: one clear error, exit code 2, nothing queued ------------------------------------

def submit_fails(spec: JobSpec, match: str) -> SlurmError:
    try:
        with pytest.raises(SlurmError, match=match) as info:
            submit(spec)
    finally:
        queued = subprocess.run(["squeue", "-h", "--name", spec.name, "-o", "%i"],
                                capture_output=True, text=True, env=env_for_tests(PATH=REAL_PATH))
        for job_id in queued.stdout.split():  # never leave a wrongly accepted job behind
            subprocess.run(["scancel", job_id], env=env_for_tests(PATH=REAL_PATH), check=False)
    assert info.value.exit_code == 2
    assert queued.returncode == 0 and queued.stdout.strip() == "", queued
    return info.value


REAL_PATH = os.environ["PATH"]


def test_unknown_partition(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    submit_fails(job_spec(tmp_path, "slurm.partition=nope"),
                 r"'nope' is not a partition of this cluster; partitions: debug")


def test_more_nodes_than_the_cluster_has(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    submit_fails(job_spec(tmp_path, "nnodes=3"),
                 r"3 nodes were asked for but the default partition has 2 .*at most 2")


def fake_bin(tmp_path: Path, *, without: str = "", failing: str = "") -> str:
    """A PATH with the real Slurm commands, minus ``without``, and ``failing`` as a stub that
    fails like a cluster without accounting."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in SLURM_COMMANDS:
        real = subprocess.run(["which", name], capture_output=True, text=True).stdout.strip()
        if name == failing:
            (bin_dir / name).write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting "
                                        "storage is disabled' >&2\nexit 1\n")
            (bin_dir / name).chmod(0o755)
        elif name != without and real:
            (bin_dir / name).symlink_to(real)
    return str(bin_dir)  # nothing else: no system sbatch either


def test_no_accounting(slurm_cluster: SlurmCluster, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake_bin(tmp_path, failing="sacct"))
    submit_fails(job_spec(tmp_path), r"no job accounting.*slurmdbd")


def test_sbatch_missing(slurm_cluster: SlurmCluster, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake_bin(tmp_path, without="sbatch"))
    submit_fails(job_spec(tmp_path), r"`sbatch` is not on PATH.*slurm-client")


def test_a_refused_sbatch_is_a_slurm_error(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    error = submit_fails(job_spec(tmp_path, "resources.memory=900Gi"), r"sbatch refused the job")
    assert "memory" in str(error).lower() or "not available" in str(error), error


def test_sweep_is_one_job_array(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    spec = job_spec(tmp_path, "nnodes=1", "nproc_per_node=1", "trainer.args.max_steps=5",
                    "trainer.args.batch_size=32")
    job_ids = submit_sweep(spec, {"lr": ["1e-3", "3e-3"]})
    assert len(job_ids) == 2 and len({j.split("_")[0] for j in job_ids}) == 1, job_ids
    for job_id in job_ids:
        assert slurm_cli.wait(job_id, timeout=300) == "COMPLETED"
    for lr in ("1e-3", "3e-3"):
        summary = json.loads((tmp_path / f"lr={lr}" / "summary.json").read_text())
        assert summary["steps"] == 5
        config = json.loads(next((tmp_path / f"lr={lr}" / "checkpoints").glob(
            "step_*/manifest.json")).read_text())["config"]
        assert config["lr"] == float(lr)


def test_hostile_run_dir_never_reaches_a_shell(slurm_cluster: SlurmCluster,
                                               tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    run_dir = tmp_path / f"a b'; touch {marker}; echo '"
    spec = job_spec(run_dir, "nnodes=1", "nproc_per_node=1", "trainer.args.max_steps=3",
                    "trainer.args.batch_size=32")
    job_id = submit(spec)
    assert slurm_cli.wait(job_id, timeout=300) == "COMPLETED", task_logs(run_dir, job_id)
    assert (run_dir / "summary.json").exists() and not marker.exists()

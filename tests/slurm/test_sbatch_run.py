"""Rendered sbatch scripts on the real local cluster: the default job on 2 nodes x 2 workers
(equal to `torchjob run`), a USR2 stop, `scontrol requeue` and a real time limit (each
checkpoints, requeues and resumes with no step lost), a node lost mid-run (elastic and fixed),
and `torchjob logs` per attempt and rank with the first failing rank.

Each job is named ``sbatch-test-...`` so that it can be told apart from other tests' jobs on
the shared cluster; a test cancels only the job it submitted.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest

from torchjob.jobs.backend import Handle
from torchjob.jobs.load import loads
from torchjob.slurm.backend import create
from torchjob.slurm.sbatch import render_sbatch
from tests.procs import PYTHON, ROOT, beside, env_for_tests, last_step, wait_for
from tests.slurm.conftest import assert_same_result, requeued_at_once, step_processes
from torchjob.trainer.contract import log_prefix
from torchjob.trainer.env import slurm_port

if TYPE_CHECKING:
    from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

# torchjob run's default: 2 processes x batch 32 = 64 samples per step; here 4 ranks x 16.
TWO_BY_TWO = "nnodes: 2\nnproc_per_node: 2\ntrainer: {args: {batch_size: 16, %s}}\n"
REQUEUE_WAIT_S = 400  # generous: the machine is shared; requeued_at_once lifts Slurm's hold


def submit(tmp_path: Path, name: str, yaml: str) -> tuple[Path, Path]:
    """Render the job with this checkout and interpreter; return (script, run_dir)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = loads(f"name: {name}\nrun_dir: {json.dumps(str(run_dir))}\n{yaml}")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(spec, python=PYTHON, workdir=str(ROOT)))
    return script, run_dir


def sbatch_wait(script: Path, timeout: float, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["sbatch", "--parsable", "--wait", *options, str(script)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env_for_tests())


def finish(proc: subprocess.Popen[str], job_id: str, run_dir: Path,
           timeout: float) -> tuple[int, str]:
    """Wait for ``sbatch --wait``; on a timeout cancel our job and fail with its log."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", job_id], check=False)
        proc.kill()
        pytest.fail(f"job {job_id} still running after {timeout}s:\n{logs(run_dir)[-3000:]}")
    return proc.returncode, out + err


def logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("slurm-*")))


def job_id_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip().split(";")[0]


def wait_for_step(job_id: str, run_dir: Path, step: int, timeout: float) -> None:
    """Wait until the job has logged STEP; on a timeout cancel the job and fail."""
    try:
        wait_for(lambda: last_step(run_dir) >= step, timeout, f"step {step}")
    except AssertionError:
        subprocess.run(["scancel", job_id], check=False)
        raise


def usr2_at_step(script: Path, run_dir: Path, step: int,
                 timeout: float) -> tuple[str, int, str, float]:
    """Submit SCRIPT; once STEP is logged send USR2 to the batch shell (what
    --signal=B:USR2@N sends before the time limit); wait for the job with Slurm's requeue
    hold lifted. Returns (job id, exit code, sbatch's output, seconds since the signal)."""
    proc = sbatch_wait(script, REQUEUE_WAIT_S)
    job_id = job_id_of(proc)
    wait_for_step(job_id, run_dir, step, timeout)
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True)
    started = time.monotonic()
    with requeued_at_once(job_id):
        code, output = finish(proc, job_id, run_dir, REQUEUE_WAIT_S)
    return job_id, code, output, time.monotonic() - started


def train_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r.get("kind") == "train"]


def test_default_job_on_two_nodes_by_two(slurm_cluster: SlurmCluster, tmp_path: Path,
                                         local_two_by_two: dict[str, float]) -> None:
    """The default job through the rendered script ends exactly where ``torchjob run`` of the
    same job (2 nodes x 2, same seed and global batch) ends; with its rendezvous port, the one
    its job id gives, already served on its first node (as a slurmd's may be), it takes the
    next one."""
    script, run_dir = submit(tmp_path, "sbatch-test-default", TWO_BY_TWO % "epochs: 12")
    proc = sbatch_wait(script, 300, "--hold")
    job_id = job_id_of(proc)
    with socket.socket() as taken:  # n1 is this host
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a TIME_WAIT
        try:
            taken.bind(("0.0.0.0", slurm_port(int(job_id))))
        except OSError as err:
            subprocess.run(["scancel", job_id], check=False)
            pytest.fail(f"job {job_id}'s port {slurm_port(int(job_id))} is in use here: {err}")
        taken.listen()
        subprocess.run(["scontrol", "release", job_id], check=True)
        code, output = finish(proc, job_id, run_dir, 300)
    assert code == 0, f"{output}\n{logs(run_dir)[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["accuracy"] >= 0.95, summary
    port = re.search(r"rendezvous n1:(\d+)", logs(run_dir))
    assert port is not None and int(port[1]) != slurm_port(int(job_id)), logs(run_dir)[:2000]
    assert (f"on n1 were in use: the rendezvous is on port {port[1]}") in logs(run_dir)
    assert_same_result(summary, local_two_by_two)
    assert not (run_dir / ".torchjob-nodes").exists()  # each node's status, read and removed


def test_usr2_checkpoints_requeues_and_loses_no_step(slurm_cluster: SlurmCluster,
                                                     tmp_path: Path) -> None:
    """USR2 to the batch shell (what --signal=B:USR2@N sends before the time limit): the
    workers checkpoint and exit 143, the script requeues the job, the next attempt resumes."""
    script, run_dir = submit(tmp_path, "sbatch-test-requeue",
                             "slurm: {max_requeues: 1}\n"
                             + TWO_BY_TWO % "epochs: 20, log_every: 1, checkpoint_every: 1000")
    job_id, code, output, waited = usr2_at_step(script, run_dir, 40, 120)
    text = logs(run_dir)
    assert code == 0, f"{output}\n{text[-3000:]}"
    assert "attempt 1 on 2 node(s)" in text and "requeueing, attempt 1 of 1" in text, text
    stopped = [line for line in text.splitlines() if "stopped by SIGTERM after step" in line]
    assert len(stopped) == 4, text  # every rank stopped, after the same step
    step = int(stopped[0].split("after step ")[1].split(":")[0])
    assert step < 440 and f"from step {step}" in text, text  # 22 steps/epoch x 20 epochs
    steps = train_steps(run_dir)
    counts = collections.Counter(steps)
    assert sorted(counts) == list(range(1, 441)), "a step is missing"
    assert [s for s, n in counts.items() if n > 1] == [], "a step ran twice"
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 4
    assert waited < REQUEUE_WAIT_S
    # `torchjob logs`: every line with the one prefix: node, rank (or the job's own), attempt
    lines = torchjob_logs(job_id)
    assert not any("first failing rank" in line for line in lines), lines[-20:]
    for rank in range(4):
        assert any(of_rank(line, rank, 0) and f"stopped by SIGTERM after step {step}" in line
                   for line in lines), rank
        assert any(of_rank(line, rank, 1) and "joined: rank" in line for line in lines), rank
    assert any(of_rank(line, 0, 1) and f"resumed from step_{step:08d}" in line
               for line in lines), lines[-50:]
    assert any(line.startswith(log_prefix("-", "-", 0) + "torchjob: ") and
               "requeueing, attempt 1 of 1" in line for line in lines)
    assert any(line.startswith(log_prefix("-", "-", 1) + "torchjob: ") and
               "attempt 1 on 2 node(s)" in line for line in lines)
    starts = [i for i, line in enumerate(lines) if line.split("] ")[0].endswith("attempt 1")]
    assert all(line.split("] ")[0].endswith("attempt 0") for line in lines[:starts[0]])
    assert all(line.split("] ")[0].endswith("attempt 1") for line in lines[starts[0]:])


def test_a_failing_job_names_its_first_failing_rank(slurm_cluster: SlurmCluster,
                                                    tmp_path: Path) -> None:
    """A batch too big for a rank's share of the data: every rank stops with a configuration
    error (exit 2, never retried); ``torchjob logs`` shows each rank's message and names the
    rank that failed first."""
    script, run_dir = submit(tmp_path, "sbatch-test-failing", TWO_BY_TWO.replace(
        "batch_size: 16", "batch_size: 1000") % "epochs: 1")
    proc = sbatch_wait(script, 300)
    job_id = job_id_of(proc)
    code, output = finish(proc, job_id, run_dir, 300)
    assert code == 2, f"{output}\n{logs(run_dir)[-3000:]}"
    lines = torchjob_logs(job_id)
    # never retried (no attempt 1); the closing line names the first failing rank, what it
    # did and where the full log is
    assert not any(of_rank(line, r, 1) for line in lines for r in range(4)), lines[-20:]
    failing = next(filter(None, (re.fullmatch(
        r"torchjob: attempt 0: first failing rank: ([0-3]) \(node [01]\): stopped on a "
        r"configuration error \(exit 2\) \(ConfigError: .*one optimizer step takes \d+ "
        r"samples \(batch size 1000 .*\): a configuration error is never retried; fix it and "
        r"run again; full log: \S+/slurm-\d+\.out and \S+/slurm-\d+\.err", line)
        for line in lines)), None)
    assert failing, lines[-20:]
    for r in range(4):
        assert any(of_rank(line, r, 0) and f"trainer [rank {r}]: one "
                   "optimizer step takes " in line and "samples (batch size 1000 x" in line
                   for line in lines), (r, lines[-50:])
    assert backend_status(job_id) == ("FAILED", 2)


def of_rank(line: str, rank: int, attempt: int) -> bool:
    """A worker's line of ``rank`` in ``attempt`` (on either node: Slurm numbers the nodes,
    the rendezvous the ranks)."""
    return any(line.startswith(log_prefix(node, rank, attempt)) for node in (0, 1))


def torchjob_logs(job_id: str) -> list[str]:
    """What `torchjob logs slurm:JOB_ID` prints (the run directory found from the job)."""
    return list(create("").logs(Handle("slurm", job_id)))


def backend_status(job_id: str) -> tuple[str, int | None]:
    status = create("").status(Handle("slurm", job_id))
    return status.state.value, status.exit_code


def test_scontrol_requeue_mid_run_resumes_from_the_last_checkpoint(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """``scontrol requeue`` (or preemption) sends SIGTERM to every process of the job at once.
    The workers hear one stop and checkpoint where they are, unless Slurm's kill of the step
    comes first: the next attempt resumes from that stop checkpoint, or from the last periodic
    one. Either way no step is lost, and only steps after the resumed checkpoint run twice."""
    every = 20
    script, run_dir = submit(tmp_path, "sbatch-test-scontrol-requeue", TWO_BY_TWO
                             % f"epochs: 20, log_every: 1, checkpoint_every: {every}")
    proc = sbatch_wait(script, REQUEUE_WAIT_S)
    job_id = job_id_of(proc)
    wait_for_step(job_id, run_dir, 50, 120)
    subprocess.run(["scontrol", "requeue", job_id], check=True, env=env_for_tests())
    with requeued_at_once(job_id):
        code, output = finish(proc, job_id, run_dir, REQUEUE_WAIT_S)
    text = logs(run_dir)
    assert code == 0, f"{output}\n{text[-3000:]}"
    resumed = [line for line in text.splitlines() if "training 440 steps" in line]
    assert len(resumed) == 2 and resumed[0].endswith("from step 0"), text
    start = int(resumed[1].rsplit("from step ", 1)[1])
    # a periodic checkpoint at or after step 40, or the stop's own at or after step 50
    assert start >= 40 and (start % every == 0 or start >= 50), resumed
    counts = collections.Counter(train_steps(run_dir))
    assert sorted(counts) == list(range(1, 441)), "a step is missing"
    assert all(s > start for s, n in counts.items() if n > 1), \
        "a step before the checkpoint ran twice"


# -- a node lost mid-run: its task's processes killed at once, as when the node dies ----------

def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def store_node(job_id: str) -> str:
    """The node whose agent hosts the c10d rendezvous store. On a real cluster that is the
    first node (which also runs the batch shell, so losing it ends the job); here both nodes
    are this host and either agent may have bound the port first."""
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(slurm_port(int(job_id)))}
    for node in ("n1", "n2"):
        for pid in step_processes(job_id, node):
            with contextlib.suppress(OSError):
                if {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()} & inodes:
                    return node
    raise AssertionError(f"no agent of job {job_id} listens on its rendezvous port")


def lose_node(job_id: str, node: str) -> list[int]:
    """Stop every process of the step on ``node``, then kill them all: nothing there gets to
    react (no agent restarts its workers, no wrapper reports an exit code)."""
    pids = step_processes(job_id, node)
    assert len(pids) >= 4, pids  # wrapper, agent, 2 workers (and the forkserver)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    return pids


def lost_node_job(nnodes: str, join_timeout: int) -> str:
    """The node-loss tests' job: 2 processes per node, ``nnodes`` (fixed or MIN:MAX)."""
    return (f"nnodes: '{nnodes}'\nnproc_per_node: 2\nmax_restarts: 2\n"
            f"rdzv: {{join_timeout: {join_timeout}}}\n"
            "trainer: {args: {batch_size: 16, epochs: 12, log_every: 1, checkpoint_every: 20}}\n")


def lose_mid_run(script: Path, run_dir: Path, choose: Callable[[str], str]
                 ) -> tuple[str, str, int, str]:
    """Submit ``script``, and after step 45 lose every process of the training step on the
    node ``choose(job_id)`` names (a failed check cancels the job); (job id, the node lost,
    the job's exit code, its output) once it ended."""
    proc = sbatch_wait(script, 600)
    job_id = job_id_of(proc)
    wait_for_step(job_id, run_dir, 45, 180)
    try:
        lost = choose(job_id)
        lose_node(job_id, lost)
    except AssertionError:
        subprocess.run(["scancel", job_id], check=False)
        raise
    code, output = finish(proc, job_id, run_dir, 600)
    return job_id, lost, code, output


@pytest.mark.parametrize("nnodes", ["2"])  # elastic: test_an_elastic_job_survives_losing_any_node
def test_a_lost_node(slurm_cluster: SlurmCluster, tmp_path: Path, nnodes: str) -> None:
    """Kill the step's processes on the node that does not serve the store mid-run. Fixed
    (2): the agent on the other waits rdzv.join_timeout (30 s here) for it, gives up, and the
    job fails naming the lost node (never hangs)."""
    yaml = lost_node_job(nnodes, join_timeout=30)
    script, run_dir = submit(tmp_path, f"sbatch-test-lost-{nnodes.replace(':', '-')}", yaml)
    job_id, lost, code, output = lose_mid_run(
        script, run_dir, lambda job_id: {"n1": "n2", "n2": "n1"}[store_node(job_id)])
    text = logs(run_dir)
    assert f"torchjob: lost node(s): {lost}: the task there ended without reporting" in text, text
    assert code != 0, text
    assert "nnodes is 2 (fixed): the job cannot continue without every node" in text, text
    assert not (run_dir / "summary.json").exists()
    # the failure, by attempt and rank (a killed worker may leave its last line unended,
    # and the batch shell's report then continues it)
    shown = "\n".join(torchjob_logs(job_id))
    assert re.search(rf"^\[node . rank . attempt 0\] .*torchjob: lost node\(s\): {lost}",
                     shown, re.M), shown[-3000:]


def test_a_stop_as_the_work_ends(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """USR2 (a time limit's warning) just as the last step is logged: it lands in the last
    steps, in the final evaluation and checkpoint, or while one node waits for the other at
    the end. Wherever it lands, every rank ends at once (no 30 s stop grace running out, no
    node left waiting 300 s in torchrun's exit barrier until the time limit kills the job),
    and the job completes, after one requeue that resumes from the final checkpoint if the
    stop came before the end."""
    script, run_dir = submit(tmp_path, "sbatch-test-stop-at-end",
                             "slurm: {time: '4', max_requeues: 2}\n"
                             + TWO_BY_TWO % "epochs: 4, log_every: 1")
    job_id, code, output, _ = usr2_at_step(script, run_dir, 88, 180)
    text = logs(run_dir)
    assert code == 0, f"{output}\n{text[-3000:]}"
    assert "grace" not in text and "Unable to shutdown process" not in text, text[-3000:]
    state = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-o", "State"],
                           capture_output=True, text=True, env=env_for_tests()).stdout.split()
    assert state == ["COMPLETED"], state
    counts = collections.Counter(train_steps(run_dir))
    assert sorted(counts) == list(range(1, 89)), "a step is missing"
    assert [s for s, n in counts.items() if n > 1] == [], "a step ran twice"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 88 and summary["world_size"] == 4, summary
    if "requeueing" in text:  # stopped before the end: the next attempt resumes at the end
        assert "training 88 steps (22/epoch, global batch 64) from step 88" in text, text


def test_time_limit_shorter_than_the_work(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A 1-minute limit for more than one attempt's work: Slurm's own USR2 to the batch shell
    (``--signal=B:USR2@15``; Slurm may send it up to ~30 s early) stops the first attempt
    after a checkpoint, the script requeues the job, and the next attempt resumes where it
    stopped. Nothing is sent by the test; it lifts the requeue hold, and after the first
    requeue it raises the limit, so that the work needs no more than two attempts (later
    requeues counted: test_sbatch_render.py; a stop as the work ends: the test above). The
    first attempt's steps sleep 0.2 s each (tests/slurm/slow_first_attempt.py): at most 300
    steps fit in its minute, on any machine, of the 400 of the work (2200 busy steps before,
    all of one machine's cores for 2 minutes)."""
    work = 400
    script, run_dir = submit(tmp_path, "sbatch-test-time-limit",
                             "slurm: {time: '1', signal_delay: 15, max_requeues: 8}\n"
                             "checkpoint_budget: 10\n"
                             + TWO_BY_TWO % ("task: 'tests.slurm.slow_first_attempt:digits', "
                                             f"epochs: 100, max_steps: {work}, log_every: 1, "
                                             "checkpoint_every: 0"))
    proc = sbatch_wait(script, 1200)
    job_id = job_id_of(proc)

    def raise_limit_after_the_first_requeue(done: threading.Event) -> None:
        while not done.wait(1):
            if "requeueing, attempt 1 of 8" in logs(run_dir):
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=15"],
                               check=False, capture_output=True, env=env_for_tests())
                return

    with beside(raise_limit_after_the_first_requeue), requeued_at_once(job_id):
        code, output = finish(proc, job_id, run_dir, 1200)
    text = logs(run_dir)
    assert code == 0, f"{output}\n{text[-3000:]}"
    assert "torchjob: USR2: asking the training step to checkpoint" in text, text
    assert "requeueing, attempt 1 of 8 requeues" in text, text
    stops = [int(line.split("after step ")[1].split(":")[0]) for line in text.splitlines()
             if "[rank 0/4] stopped by SIGTERM after step" in line]
    starts = [int(line.rsplit("from step ", 1)[1]) for line in text.splitlines()
              if f"training {work} steps" in line]
    assert len(stops) >= 1 and starts[1:] == stops, (stops, starts)  # resumes where it stopped
    counts = collections.Counter(train_steps(run_dir))
    assert sorted(counts) == list(range(1, work + 1)), "a step is missing"
    assert [s for s, n in counts.items() if n > 1] == [], "a step ran twice"


# -- no single point of failure: the node the rendezvous endpoint points at may be lost too ---

TRIALS = int(os.environ.get("TORCHJOB_TRIALS", "1"))  # by hand: TORCHJOB_TRIALS=5


def store_owner(job_id: str) -> str:
    """Who serves the job's rendezvous store: ``batch`` (the batch shell's own process, as
    rendered for an elastic job) or the node whose training task listens on the port."""
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(slurm_port(int(job_id)))}
    if not inodes:
        return "nobody"
    for node in ("n1", "n2"):
        for pid in step_processes(job_id, node):
            with contextlib.suppress(OSError):
                if {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()} & inodes:
                    return node
    return "batch"


# n1, where the endpoint points and the batch shell serves the store; n2's loss is the usual
# elastic case (test_a_lost_node: the same loss at a fixed size). By hand: TORCHJOB_LOST=n1,n2
@pytest.mark.parametrize("lost", os.environ.get("TORCHJOB_LOST", "n1").split(","))
def test_an_elastic_job_survives_losing_any_node(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                 lost: str) -> None:
    """nnodes 1:2; the rendezvous endpoint is the first node, n1, where the batch shell serves
    the store (no training task does). Lose every process of the training step on ``lost``
    mid-run, n1 (where the endpoint points) or n2: the store keeps serving, the other node
    finishes at world size 2, the job exits 0. TORCHJOB_TRIALS times (5 by hand)."""
    yaml = lost_node_job("1:2", join_timeout=60)
    failures = []
    for trial in range(TRIALS):
        began = time.monotonic()
        trial_dir = tmp_path / f"trial{trial}"
        trial_dir.mkdir()
        script, run_dir = submit(trial_dir, f"sbatch-test-rdzv-{lost}", yaml)
        assert "-m torchjob.trainer.store --port" in script.read_text()

        def served_by_batch(job_id: str) -> str:
            owner = store_owner(job_id)
            assert owner == "batch", f"the rendezvous store is served by {owner}, not the " \
                                     "batch shell"
            return lost

        _, _, code, output = lose_mid_run(script, run_dir, served_by_batch)
        text = logs(run_dir)
        summary = run_dir / "summary.json"
        problem = None
        if code != 0:
            problem = f"exit {code}"
        elif f"torchjob: lost node(s): {lost}:" not in text:
            problem = "the batch script did not report the lost node"
        elif not summary.is_file() or json.loads(summary.read_text())["world_size"] != 2:
            problem = "no summary at world size 2"
        print(f"trial {trial}: lost {lost} at step >= 45: {problem or 'ok'} in "
              f"{time.monotonic() - began:.1f}s")
        if problem:
            failures.append(f"trial {trial}: {problem}\n{output}\n{text[-3000:]}")
    assert not failures, f"{len(failures)}/{TRIALS} trials failed:\n" + "\n".join(failures)

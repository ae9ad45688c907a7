"""The Slurm backend (``slurm`` through submitit, ``slurm:sbatch``): what it submits is what
``render`` prints, byte for byte; run, status, logs, cancel and list on the real local cluster;
an elastic job whose worker is killed; a sweep as one job array; the README's Slurm session;
bad input stopped before anything is queued.

Each job is named ``bk-...`` so that it can be told apart from other tests' jobs on the shared
cluster; a test cancels only the job it submitted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from torchjob.jobs.backend import BackendError, Context, Handle, State
from torchjob.jobs.load import load
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import UserError
from torchjob.slurm.backend import SlurmBackend, create
from torchjob.slurm.cluster import SlurmError
from tests.procs import (PYTHON, ROOT, TORCHJOB, env_for_tests, is_fork_server, last_step, parent,
                         Terminal, stop_again, torchjob, wait_for)
from tests.readme_sessions import run_session, sessions
from tests.slurm.conftest import step_processes
from torchjob.trainer.contract import log_prefix

if TYPE_CHECKING:
    from tests.slurm.conftest import SlurmCluster

DEFAULT = ROOT / "jobs" / "examples" / "default.yaml"
SLURM_COMMANDS = ("sbatch", "srun", "sinfo", "squeue", "sacct", "scancel", "scontrol")
REAL_PATH = os.environ["PATH"]
SMALL = ("nproc_per_node=1", "trainer.args.batch_size=32", "trainer.args.max_steps=5")


def context(sweep: dict[str, list[str]] | None = None) -> Context:
    """What the command line passes: this interpreter, the directory it runs in."""
    return Context(run_id="test", python=PYTHON, workdir=str(ROOT), sweep=sweep)


def job_spec(run_dir: Path, *sets: str) -> JobSpec:
    return load(DEFAULT, [f"name=bk-{uuid.uuid4().hex[:6]}", f"run_dir={json.dumps(str(run_dir))}",
                          *sets])


@contextlib.contextmanager
def cancelled_on_failure(job_id: str) -> Iterator[None]:
    """Cancel the job if the test fails before it ends (never leave it to hold the nodes)."""
    try:
        yield
    except BaseException:
        subprocess.run(["scancel", job_id], env=env_for_tests(), check=False)
        raise


# -- pure: no cluster -------------------------------------------------------------------------

@pytest.mark.parametrize("sweep", [[], ["--sweep", "lr=1e-3,3e-3"]])
def test_submit_dry_run_prints_exactly_what_render_prints(sweep: list[str]) -> None:
    render = torchjob("render", "--to", "slurm", str(DEFAULT), *sweep, env=env_for_tests())
    dry_run = torchjob("submit", "--to", "slurm", "--dry-run", str(DEFAULT), *sweep,
                       env=env_for_tests())
    assert render.returncode == 0, render.stderr
    assert dry_run.stdout == render.stdout and dry_run.returncode == 0, dry_run.stderr
    assert render.stdout.startswith("#!/bin/bash\n")
    assert ("#SBATCH --array=0-1\n" in render.stdout) == bool(sweep)


def test_the_request_is_the_rendered_script() -> None:
    from torchjob.slurm.sbatch import render_sbatch

    spec = load(DEFAULT)
    for name in ("", "sbatch"):
        request = create(name).render(spec, context(sweep={"lr": ["1e-3", "3e-3"]}))
        assert request.backend == ("slurm:sbatch" if name else "slurm")
        assert request.data == request.text == render_sbatch(
            spec, python=PYTHON, workdir=str(ROOT), sweep={"lr": ["1e-3", "3e-3"]})
    with pytest.raises(BackendError, match="no variant 'x'"):
        create("x")
    assert create("").parse_handle("12_3") == Handle("slurm", "12_3")
    with pytest.raises(BackendError, match="not a Slurm job id"):
        create("").parse_handle("12;x")
    with pytest.raises(UserError, match="must be an absolute path"):
        create("").render(spec, Context(run_id="t", workdir="relative"))


# -- on the cluster ---------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.slurm
def test_run_submits_through_submitit_exactly_what_render_prints(
        slurm_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run`: the script submitit hands to sbatch is `torchjob render --to slurm`'s output,
    byte for byte, even with a run directory no shell may split; run follows the logs with
    the one prefix and returns the job's exit code; status, logs and list agree."""
    marker = tmp_path / "pwned"
    run_dir = tmp_path / f"a b'; touch {marker}; echo '"
    sets = ("nnodes=2", *SMALL)
    spec = job_spec(run_dir, *sets)
    backend = create("")
    backend.fits(spec)
    request = backend.render(spec, context())
    backend.preflight(request)
    code = backend.run(request)
    out, err = capsys.readouterr()
    job_id = re.search(r"torchjob: submitted slurm:(\d+)", err)[1]  # type: ignore[index]
    assert code == 0, out[-3000:]
    rendered = torchjob("render", "--to", "slurm", str(DEFAULT), "--set", f"name={spec.name}",
                        "--set", f"run_dir={json.dumps(str(run_dir))}",
                        *[w for s in sets for w in ("--set", s)], env=env_for_tests())
    assert rendered.returncode == 0, rendered.stderr
    assert (run_dir / "submitit" / f"{job_id}_submission.sh").read_text() == rendered.stdout
    assert not marker.exists() and json.loads((run_dir / "summary.json").read_text())["steps"] == 5
    lines = out.splitlines()
    for rank in (0, 1):
        assert any(re.match(rf"\[node [01] rank {rank} attempt 0\] .*joined: rank {rank} ", line)
                   for line in lines), lines[-40:]
    assert lines[0].startswith(log_prefix("-", "-", 0) + f"torchjob: {spec.name} job {job_id} "
                               "attempt 0 on 2 node(s)"), lines[:3]
    handle = Handle("slurm", job_id)
    status = backend.status(handle)
    assert (status.state, status.exit_code, status.name) == (State.SUCCEEDED, 0, spec.name)
    assert sorted(backend.logs(handle)) == sorted(lines)
    assert handle in [s.handle for s in backend.list()]


@pytest.mark.integration
@pytest.mark.slurm
def test_an_elastic_job_restarts_a_killed_worker(slurm_cluster: SlurmCluster,
                                                 tmp_path: Path) -> None:
    """nnodes 1:2 through submitit: the job asks for --nodes=1-2, its group forms on both
    nodes; kill -9 of one worker makes the agents restart the group (max_restarts 2) from the
    last checkpoint, and the job completes with exit code 0."""
    run_dir = tmp_path / "run"
    spec = job_spec(run_dir, "nnodes=1:2", "nproc_per_node=2", "max_restarts=2",
                    "trainer.args.batch_size=16", "trainer.args.epochs=6",
                    "trainer.args.log_every=1", "trainer.args.checkpoint_every=20")
    backend = create("")
    request = backend.render(spec, context())
    assert "#SBATCH --nodes=1-2\n" in request.text and "#SBATCH --no-kill\n" in request.text
    handle = backend.submit(request)
    with cancelled_on_failure(handle.id):
        wait_for(lambda: last_step(run_dir) >= 30, 180, "step 30")
        workers = [pid for node in ("n1", "n2") for pid in step_processes(handle.id, node)
                   if is_fork_server(parent(pid))]
        assert len(workers) == 4, workers  # 2 nodes x 2 workers: the group formed on both
        os.kill(workers[-1], signal.SIGKILL)
        status = backend.wait(handle)
    text = "\n".join(backend.logs(handle))
    assert (status.state, status.exit_code) == (State.SUCCEEDED, 0), text[-3000:]
    assert "attempt 0 on 2 node(s)" in text
    # every worker joined twice. The killed worker's agent counts a restart (its two workers
    # say TORCHELASTIC_RESTART_COUNT 1); the other agent may see that node waiting in the
    # rendezvous before its own workers fail, and torch's agent counts no restart for a node
    # that waits, so its workers say 0 or 1. Node ranks may change between rounds.
    joins: dict[str, list[str]] = {}
    for rank, count in re.findall(r"^\[node \d rank (\d) attempt \d\] \S+ \[rank \d/4\] joined: "
                                  r".* world_size 4 .* restart (\d)$", text, re.M):
        joins.setdefault(rank, []).append(count)
    assert sorted(joins) == ["0", "1", "2", "3"], joins
    assert all(counts[0] == "0" and len(counts) == 2 for counts in joins.values()), joins
    assert sorted(counts[1] for counts in joins.values())[2:] == ["1", "1"], joins
    assert re.search(r"resumed from step_000000[2-9]0", text), text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["steps"] == 6 * 22, summary


@pytest.mark.integration
@pytest.mark.slurm
def test_a_sweep_is_one_job_array(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """--sweep lr=1e-3,3e-3 through submitit: one job array of two tasks, each point in its
    own run directory with its own learning rate; the array's status is both tasks'."""
    spec = job_spec(tmp_path, "nnodes=1", *SMALL)
    backend = create("")
    handle = backend.submit(backend.render(spec, context(sweep={"lr": ["1e-3", "3e-3"]})))
    with cancelled_on_failure(handle.id):
        status = backend.wait(handle)
    assert (status.state, status.exit_code) == (State.SUCCEEDED, 0), status.detail
    assert sorted(status.raw) == [f"{handle.id}_0", f"{handle.id}_1"]
    lines = list(backend.logs(handle))
    for i, lr in enumerate(("1e-3", "3e-3")):
        summary = json.loads((tmp_path / f"lr={lr}" / "summary.json").read_text())
        assert summary["steps"] == 5
        config = json.loads(next((tmp_path / f"lr={lr}" / "checkpoints").glob(
            "step_*/manifest.json")).read_text())["config"]
        assert config["lr"] == float(lr)
        assert f"[{handle.id}_{i}] {log_prefix('-', '-', 0)}torchjob: sweep point {i}: " \
            f"lr={lr}" in lines
    task = backend.status(Handle("slurm", f"{handle.id}_1"))
    assert (task.state, task.exit_code) == (State.SUCCEEDED, 0)
    # each task's progress is its point's (torchjob status slurm:ID_1), the array's both
    told = backend.progress(task)
    assert told is not None and (told.step, told.total_steps) == (5, 5), told
    assert told.source == str(tmp_path / "lr=3e-3")
    whole = backend.progress(status)
    assert whole is not None and whole.step is None, whole
    assert {task: (t.step, t.source) for task, t in whole.tasks.items()} == {
        f"{handle.id}_{i}": (5, str(tmp_path / f"lr={lr}"))
        for i, lr in enumerate(("1e-3", "3e-3"))}


@pytest.mark.integration
@pytest.mark.slurm
def test_cancel_checkpoints_and_stops_for_good(slurm_cluster: SlurmCluster,
                                              tmp_path: Path) -> None:
    """slurm:sbatch: Slurm holds the rendered script as it is; `cancel` makes the workers
    checkpoint and stop: the job ends STOPPED with 143, not requeued."""
    run_dir = tmp_path / "run"
    spec = job_spec(run_dir, "nnodes=1", "nproc_per_node=1", "trainer.args.batch_size=32",
                    "trainer.args.epochs=500", "trainer.args.log_every=1",
                    "trainer.args.checkpoint_every=0")
    backend = create("sbatch")
    request = backend.render(spec, context())
    handle = backend.submit(request)
    with cancelled_on_failure(handle.id):
        held = subprocess.run(["scontrol", "write", "batch_script", handle.id, "-"],
                              capture_output=True, text=True, env=env_for_tests())
        assert held.stdout == request.text, held.stderr
        wait_for(lambda: last_step(run_dir) >= 20, 180, "step 20")
        assert backend.cancel(handle) == f"asked {handle.id} to checkpoint and stop (exit 143)"
        status = backend.wait(handle)
    text = "\n".join(backend.logs(handle))
    assert (status.state, status.exit_code) == (State.STOPPED, 143), text[-3000:]
    assert "stopped by torchjob cancel after a checkpoint" in text and "attempt 1" not in text
    stopped = re.search(r"stopped by SIGTERM after step (\d+)", text)
    assert stopped and (run_dir / "checkpoints" / f"step_{int(stopped[1]):08d}").is_dir(), text
    assert backend.cancel(handle) == f"{handle} had already ended"


STOPS_SLOWLY = """
import os, signal, sys, time
run = os.environ["TORCHJOB_RUN_DIR"]
def stop(signum, frame):
    open(os.path.join(run, "stopping"), "w").close()
    time.sleep(3)  # a checkpoint that takes a moment
    open(os.path.join(run, "stopped"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(run, "started"), "w").close()
beat = 0
while True:
    beat += 1
    with open(os.path.join(run, "beats"), "w") as f:  # how long it has run, in tenths
        f.write(str(beat))
    time.sleep(0.1)
"""


@pytest.mark.integration
@pytest.mark.slurm
def test_a_second_stop_leaves_the_job_stopping(slurm_cluster: SlurmCluster,
                                               tmp_path: Path) -> None:
    """The first Ctrl-C cancels (the workers checkpoint), the second leaves the job stopping on
    its own, exit 143; Slurm ends it after its checkpoint. Each stop is taken in turn: two
    counted within one look had jumped the count to 2, and the run left a job it had never
    cancelled (it ran on)."""
    (tmp_path / "loop.py").write_text(STOPS_SLOWLY)
    (tmp_path / "job.yaml").write_text(f"name: twice-{uuid.uuid4().hex[:6]}\n"
                                       "nproc_per_node: 1\ntrainer: {script: loop.py}\n")
    run = subprocess.Popen([*TORCHJOB, "run", "--to", "slurm", "job.yaml"], cwd=tmp_path,
                           env=env_for_tests(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: list(tmp_path.glob("runs/*/started")) or run.poll() is not None, 120,
                 "the script to start on Slurm")
        assert run.poll() is None, run.communicate()[0]
        first = time.monotonic()
        run.send_signal(signal.SIGINT)
        wait_for(lambda: list(tmp_path.glob("runs/*/stopping")), 60, "the cancel's SIGTERM")
        stop_again(run, first)
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    found = re.search(r"submitted slurm:(\d+)", out)
    assert found, out
    with cancelled_on_failure(found[1]):
        assert run.returncode == 143, out
        assert "asked" in out and "goes on stopping on its own" in out, out
        wait_for(lambda: not queued(found[1]), 90, f"job {found[1]} to leave the queue")
    assert list(tmp_path.glob("runs/*/stopped")), out


@pytest.mark.integration
@pytest.mark.slurm
def test_a_hang_up_leaves_the_slurm_job_running(slurm_cluster: SlurmCluster,
                                                tmp_path: Path) -> None:
    """The terminal of `torchjob run --to slurm` closed (an ssh session dropped): the run
    ends, and the job goes on on the cluster, as sbatch's would; Ctrl-C would cancel it."""
    (tmp_path / "loop.py").write_text(STOPS_SLOWLY)
    (tmp_path / "job.yaml").write_text(f"name: hup-{uuid.uuid4().hex[:6]}\n"
                                       "nproc_per_node: 1\ntrainer: {script: loop.py}\n")
    terminal = Terminal([*TORCHJOB, "run", "--to", "slurm", "job.yaml"], tmp_path,
                        env_for_tests())
    try:
        wait_for(lambda: list(tmp_path.glob("runs/*/started")) or terminal.proc.poll()
                 is not None, 120, "the script to start on Slurm")
        found = re.search(r"submitted slurm:(\d+)", terminal.text())
        assert found and terminal.proc.poll() is None, terminal.text()
        terminal.hang_up()
        terminal.proc.wait(timeout=30)
    finally:
        terminal.close()
    with cancelled_on_failure(found[1]):
        beats = next(tmp_path.glob("runs/*/beats"))
        ended = int(beats.read_text() or 0)
        # two seconds more of the script's life after its run ended: a cancel would have
        # reached it (its SIGTERM comes within a second of torchjob's scancel)
        wait_for(lambda: int(beats.read_text() or 0) >= ended + 20, 60,
                 "the job to run on for 2 s after its run ended")
        assert not list(tmp_path.glob("runs/*/stopping")), "the job was asked to stop"
        assert queued(found[1]), "the job left the queue"
    subprocess.run(["scancel", found[1]], env=env_for_tests(), check=True)


def queued(job_id: str) -> bool:
    return bool(subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True,
                               env=env_for_tests(), check=False).stdout.strip())


@pytest.mark.integration
@pytest.mark.slurm
def test_the_readme_slurm_session(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The README's Slurm session (run, status, a sweep's logs) prints what the README shows."""
    run_session(sessions()["slurm"], tmp_path)


@pytest.mark.integration
@pytest.mark.slurm
def test_the_readme_slurm_quickstart(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The quickstart's script on two Slurm nodes, no YAML."""
    run_session(sessions()["quick-slurm"], tmp_path)


# -- bad input: one clear error, exit code 2, nothing queued ----------------------------------

def queued_named(name: str) -> list[str]:
    env = env_for_tests(PATH=REAL_PATH)
    out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%i"], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    for job_id in out:  # never leave a wrongly accepted job behind
        subprocess.run(["scancel", job_id], env=env, check=False)
    return out


def refused(backend: SlurmBackend, spec: JobSpec, match: str) -> SlurmError:
    try:
        with pytest.raises(SlurmError, match=match) as info:
            backend.fits(spec)
            request = backend.render(spec, context())
            backend.preflight(request)
            backend.submit(request)
    finally:
        queued = queued_named(spec.name)
    assert info.value.exit_code == 2 and queued == []
    return info.value


NO_ACCOUNTING = "sacct: error: Slurm accounting storage is disabled"
NO_SLURMDBD = ("sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
               "connection to host:localhost:6819: Connection refused")


def fake_bin(tmp_path: Path, *, without: str = "", failing: str = "",
             says: str = NO_ACCOUNTING) -> str:
    """A PATH with the real Slurm commands, minus ``without``, and ``failing`` as a stub that
    fails saying ``says`` (sacct's words on a cluster without accounting)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in SLURM_COMMANDS:
        real = subprocess.run(["which", name], capture_output=True, text=True).stdout.strip()
        if name == failing:
            (bin_dir / name).write_text(f"#!/bin/sh\necho '{says}' >&2\nexit 1\n")
            (bin_dir / name).chmod(0o755)
        elif name != without and real:
            (bin_dir / name).symlink_to(real)
    return str(bin_dir)  # nothing else: no system sbatch either


@pytest.mark.integration
@pytest.mark.slurm
@pytest.mark.parametrize("sets, match", [
    (["slurm.partition=nope"], r"'nope' is not a partition of this cluster; partitions: debug"),
    (["nnodes=3"], r"3 nodes were asked for but the default partition has 2 .*at most 2"),
    (["nnodes=1:3"], r"up to 3 nodes were asked for"),
    (["resources.memory=900Gi"], r"sbatch refused the job: .*(memory|not available)"),
])
def test_what_the_cluster_cannot_take(slurm_cluster: SlurmCluster, tmp_path: Path,
                                      sets: list[str], match: str) -> None:
    refused(create(""), job_spec(tmp_path, *sets), match)


@pytest.mark.integration
@pytest.mark.slurm
@pytest.mark.parametrize("without, failing, says, match", [
    ("", "sacct", NO_ACCOUNTING, r"no job accounting.*Enable slurmdbd"),
    ("", "sacct", NO_SLURMDBD, r"Connection refused\): the cluster's accounting \(slurmdbd\) "
     r"did not answer.*is slurmdbd running\?"),
    ("sbatch", "", "", r"`sbatch` is not on PATH.*slurm-client"),
])
def test_a_host_without_what_slurm_needs(slurm_cluster: SlurmCluster, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch, without: str,
                                         failing: str, says: str, match: str) -> None:
    monkeypatch.setenv("PATH", fake_bin(tmp_path, without=without, failing=failing,
                                        says=says))
    refused(create("sbatch"), job_spec(tmp_path), match)


@pytest.mark.integration
@pytest.mark.slurm
def test_an_unknown_job_id(slurm_cluster: SlurmCluster) -> None:
    backend = create("")
    for call in (backend.status, backend.cancel, lambda h: list(backend.logs(h))):
        with pytest.raises(SlurmError, match="knows no job '999999'") as info:
            call(Handle("slurm", "999999"))
        assert info.value.exit_code == 2


@pytest.mark.integration
@pytest.mark.slurm
def test_no_process_forks_after_querying_cuda_on_slurm(slurm_cluster: SlurmCluster,
                                                       tmp_path: Path) -> None:
    """tests/integration/test_no_fork_after_cuda.py's rule on Slurm: two nodes, the built-in
    trainer (sbatch exports the recorder's PYTHONPATH to every step)."""
    from tests import cuda_forks

    record = tmp_path / "record"
    name = f"bk-{uuid.uuid4().hex[:6]}"
    sets = [f"name={name}", f"run_dir={tmp_path / 'run'}", "nnodes=2", *SMALL]
    proc = torchjob("run", "--to", "slurm", str(DEFAULT),
                    *[w for s in sets for w in ("--set", s)],
                    env=env_for_tests(**cuda_forks.recording_env(record)), timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    records = cuda_forks.read(record)
    workers = {r["pid"] for r in records if r["event"] == "cuda" and "torchjob.trainer.agent" in
               " ".join(r["argv"])}
    assert len(workers) >= 2, f"expected both nodes' agents and workers in {len(records)} records"
    cuda_forks.assert_no_fork_after_cuda(records)


@pytest.mark.integration
@pytest.mark.slurm
def test_a_script_from_the_command_line_in_a_project_with_the_kits_names(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """``torchjob run --to slurm --nnodes 2 train.py ARGS`` (no YAML) from a project holding its
    own trainer.py, jobs/, slurm.py and k8s/: two nodes train, each rank imported the user's
    modules, the kit imported none of them (tests/integration/test_user_layout.py, on Slurm)."""
    from tests.integration.test_user_layout import KIT_NAMES, project

    folder = project(tmp_path / "project")
    env = env_for_tests()
    del env["PYTHONPATH"]  # the kit as installed
    name = f"bk-{uuid.uuid4().hex[:6]}"
    proc = torchjob("run", "--to", "slurm", "--nnodes", "2", "--nproc-per-node", "1", "--name",
                    name, "train.py", "a", "--b=1", cwd=folder, env=env, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for rank in (0, 1):
        seen = json.loads((folder / "runs" / name / f"seen-{rank}.json").read_text())
        assert seen == {"who": dict.fromkeys(KIT_NAMES, "user"),
                        "mine": dict.fromkeys(KIT_NAMES, True), "sum": 2.0,
                        "argv": ["a", "--b=1"], "argv0": "train.py",
                        "file": str(folder.resolve() / "train.py")}
    assert (folder / "imported-by").read_text().split() == ["train.py"] * 8
    # the job's name stands for its latest job
    by_name = torchjob("status", f"slurm:{name}", env=env, timeout=60)
    assert by_name.returncode == 0 and ": SUCCEEDED (exit code 0)" in by_name.stdout, by_name

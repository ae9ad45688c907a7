"""torchjob's TorchX ``local_cwd`` scheduler (torchjob.jobs.backends.torchx.local), with real
processes: a cancel waits the job's stop grace, not TorchX's 10 s; the state of nodes that
ended stopped is CANCELLED whoever asks; a second Ctrl-C kills at once; nothing is left."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from torchx import specs
from torchx.schedulers import get_scheduler_factories
from torchx.specs import AppState, is_terminal

from torchjob.jobs.backends.torchx.local import GracefulLocalScheduler
from tests.procs import ROOT, TORCHJOB, alive, beside, env_for_tests, stop_again, wait_for

pytestmark = pytest.mark.integration

SAVE_S = 12  # the script's checkpoint after a stop signal: longer than TorchX's own 10 s
SLOW_SAVE = f'''
import os, signal, sys, time
run = os.environ["TORCHJOB_RUN_DIR"]
rank = os.environ["RANK"]

def stop(signum, frame):
    print(f"rank {{rank}} saving", flush=True)
    time.sleep({SAVE_S})  # a checkpoint that takes a while
    open(os.path.join(run, f"saved-{{rank}}"), "w").close()
    sys.exit(143)

signal.signal(signal.SIGTERM, stop)
with open(os.path.join(run, f"pid-{{rank}}"), "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.1)
'''


def test_torchx_makes_torchjobs_local_cwd() -> None:
    assert isinstance(get_scheduler_factories()["local_cwd"]("test"), GracefulLocalScheduler)


@pytest.mark.parametrize(("codes", "state"), [
    ((143, 0), AppState.CANCELLED),  # stopped after a checkpoint, and a node that finished
    ((143, 143), AppState.CANCELLED),
    ((143, 1), AppState.FAILED),
    ((0, 0), AppState.SUCCEEDED),
])
def test_the_state_of_ended_nodes_is_their_exit_codes(tmp_path: Path, codes: tuple[int, int],
                                                      state: AppState) -> None:
    """No cancel here: TorchX read nodes that exited 143 as FAILED unless its own cancel had
    returned first, so a status taken in between ended the run 1."""
    scheduler = GracefulLocalScheduler("test")
    script = f'test "$0" = 0 && exit {codes[0]}; exit {codes[1]}'
    role = specs.Role(name="node", image=str(tmp_path), entrypoint="bash",
                      args=["-c", script, specs.macros.replica_id], num_replicas=2)
    info = scheduler.submit_dryrun(specs.AppDef(name="codes", roles=[role]),
                                   {"log_dir": str(tmp_path / "logs")})
    app_id = scheduler.schedule(info)
    try:
        found = wait_for(lambda: (d := scheduler.describe(app_id)) and is_terminal(d.state)
                         and d, 30, f"the nodes (exit {codes}) to end")
        assert found.state == state
        assert scheduler.describe(app_id).state == state  # and so it stays
    finally:
        scheduler.close()


def start(tmp_path: Path, *extra: str, nodes: int = 1) -> subprocess.Popen[str]:
    (tmp_path / "slow_save.py").write_text(SLOW_SAVE)
    (tmp_path / "job.yaml").write_text(
        f"name: slow\nnnodes: {nodes}\nnproc_per_node: 1\ntrainer: {{script: slow_save.py}}\n")
    return subprocess.Popen([*TORCHJOB, "run", "--to", "torchx:local_cwd", "job.yaml", *extra],
                            cwd=tmp_path, env=env_for_tests(PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stopped(tmp_path: Path, run: subprocess.Popen[str], ranks: int) -> list[int]:
    """Every rank started (the pids it wrote), then the run's Ctrl-C; their pids."""
    run_dir = tmp_path / "runs" / "slow"
    wait_for(lambda: len(list(run_dir.glob("pid-*"))) == ranks or run.poll() is not None,
             120, f"{ranks} rank(s) to start")
    assert run.poll() is None, run.communicate()[0]
    run.send_signal(signal.SIGINT)
    return [int(path.read_text()) for path in run_dir.glob("pid-*")]


def ended(run: subprocess.Popen[str], pids: list[int]) -> tuple[int, str]:
    try:
        out, _ = run.communicate(timeout=SAVE_S + 60)
    except subprocess.TimeoutExpired:
        run.kill()
        raise AssertionError(f"the run did not end: {run.communicate()[0]}") from None
    wait_for(lambda: not any(alive(pid) for pid in pids), 10, f"the ranks {pids} to be gone")
    return run.returncode, out


@contextlib.contextmanager
def another_jobs_store(port: int) -> Iterator[None]:
    """A server on ``port`` of this host that closes every connection, as another job's
    rendezvous store that ends would (where the port is taken already, whoever holds it)."""
    with socket.socket() as server:
        try:
            server.bind(("127.0.0.1", port))
        except OSError:
            yield
            return
        server.listen()
        server.settimeout(0.1)

        def refuse(done: threading.Event) -> None:
            while not done.is_set():
                with contextlib.suppress(OSError):
                    server.accept()[0].close()
        with beside(refuse):
            yield


def test_a_cancel_waits_the_jobs_stop_grace(tmp_path: Path) -> None:
    """TorchX's cancel killed every node 10 s after the stop signal (the default grace is
    60 s): the checkpoint was lost. The nodes meet on a free port of this host, not the
    spec's 29400, which another job may hold (CI: both nodes' agents failed at once)."""
    with another_jobs_store(29400):
        run = start(tmp_path, nodes=2)
        pids = stopped(tmp_path, run, 2)
    code, out = ended(run, pids)
    assert code == 143, out
    assert sorted(p.name for p in (tmp_path / "runs" / "slow").glob("saved-*")) == [
        "saved-0", "saved-1"], out
    assert "within its stop grace" not in out


def test_nodes_still_saving_after_the_grace_are_killed(tmp_path: Path) -> None:
    run = start(tmp_path, "--grace", "2", "--set", "checkpoint_budget=1")
    code, out = ended(run, stopped(tmp_path, run, 1))
    assert code == 1, out
    assert "did not end within its stop grace (2 s) of the stop signal: killed" in out, out
    assert not list((tmp_path / "runs" / "slow").glob("saved-*"))


def logged(tmp_path: Path, text: str) -> bool:
    """Whether a node's log (TorchX's, under the run directory) has ``text`` yet."""
    return any(text in path.read_text(errors="replace")
               for path in (tmp_path / "runs" / "slow" / "torchx").rglob("*.log"))


def test_a_second_ctrl_c_kills_at_once(tmp_path: Path) -> None:
    run = start(tmp_path)
    pids = stopped(tmp_path, run, 1)
    first = time.monotonic()
    wait_for(lambda: logged(tmp_path, "rank 0 saving"), 30, "the rank to hear the stop")
    stop_again(run, first)
    begun = time.monotonic()
    code, out = ended(run, pids)
    assert code == 1, out
    assert "Ctrl-C again kills it now" in out and "torchjob: killing torchx:local_cwd://" in out
    assert time.monotonic() - begun < SAVE_S, out
    assert not list((tmp_path / "runs" / "slow").glob("saved-*"))

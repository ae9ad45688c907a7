"""A restart is for a lost worker, not for a bug (trainer.failures), decided alike on every node
by the agent (torchjob.trainer.torchrun_agent), for the built-in trainer and any user script
(trainer.script runs those as python would)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, ROOT, env_for_tests, free_port
from torchjob.trainer.contract import EXIT_RETRY
from torchjob.trainer.failures import (Failure, exception_line, is_peer_loss, judge, timed_out_s,
                                       within)

# rank BAD of the first attempt does WHAT at step 20 (raise, kill, flaky: raises on the
# first attempt only; peer: every rank of every attempt says it lost a peer); every rank
# prints its attempt. (A user exception on one rank and a
# script's usage error, on every backend: tests/conformance.)
SCRIPT = """
import os, signal, sys
import torch, torch.distributed as dist
what, bad = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank, restart = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("attempt", restart, flush=True)
t = torch.ones(4)
for step in range(40):
    if what == "peer" and step == 20:
        sys.exit(75)  # every rank, every attempt: only "lost a peer" (EXIT_RETRY)
    if rank == bad and step == 20 and restart == 0:
        if what in ("raise", "flaky"):
            raise ValueError(f"bad value at step {step}")
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
print("finished", rank, flush=True)
dist.destroy_process_group()
"""


def failure(code: int, rank: int = 0, at: float = 1.0, message: str = "") -> Failure:
    return Failure(0, rank, code, message, at)


@pytest.mark.parametrize("codes, restart, cause", [
    ({1: 1, 0: EXIT_RETRY}, False, 1),  # rank 1 raised, rank 0 lost it: a bug, not retried
    ({0: 2, 1: -15}, False, 0),  # a configuration error, the other closed by torch
    ({0: -15, 1: -9}, True, 1),  # kill -9 of rank 1; torch's SIGTERM to rank 0 is no cause
    ({0: -6, 1: -9}, True, 1),  # a SIGABRT is more often the consequence
    ({0: EXIT_RETRY, 1: -15}, None, 0),  # only lost a peer: the cause is on another node
    ({0: -15}, True, 0),  # SIGTERM to this node's workers alone, from outside
    ({0: 137}, True, 0),  # a shell's 128+9: a kill
    ({0: 255, 1: -15}, False, 0),  # sys.exit(-1): its own error, not "signal 127"
])
def test_the_verdict(codes: dict[int, int], restart: bool | None, cause: int) -> None:
    verdict = judge([failure(code, rank) for rank, code in codes.items()], retry_on_error=False)
    assert verdict.restart is restart and verdict.cause is not None
    assert verdict.cause.rank == cause
    assert "signal 127" not in verdict.why


def test_a_wait_that_timed_out_is_named_before_the_closed_connection_it_caused() -> None:
    """Rank 1 waited on a store key no one set (its own bug, or a peer that never came) and
    timed out; rank 0 then saw its connection closed, in the same whole second."""
    closed = failure(EXIT_RETRY, 0, message="RuntimeError: [../gloo/transport/tcp/pair.cc:534]"
                     " Connection closed by peer [127.0.0.1]:1234")
    waited = failure(EXIT_RETRY, 1, message="DistStoreError: wait timeout after 2000ms, keys: "
                     "/default_pg/0//confg")
    for order in ([closed, waited], [waited, closed]):
        assert judge(order, retry_on_error=False).cause == waited


def test_a_restart_with_none_left_fails_the_job() -> None:
    """Whatever the restart rests on: a kill, or a lost peer that no other node explained."""
    restart = judge([failure(-9)], retry_on_error=False)
    assert within(restart, 1, 3) is restart
    last = within(restart, 0, 3)
    assert last.restart is False and last.cause == restart.cause
    assert last.why == "node 0 rank 0 was killed by SIGKILL: no restarts left (max_restarts: 3)"
    peer = judge([failure(EXIT_RETRY)], retry_on_error=False)
    assert within(peer, 0, 3) is peer  # no verdict yet: the other nodes are asked first


def test_retry_on_error_restarts_a_bug_but_never_a_configuration_error() -> None:
    assert judge([failure(1)], retry_on_error=True).restart is True
    assert judge([failure(2), failure(1, 1)], retry_on_error=True).restart is False


@pytest.mark.parametrize("text, seconds", [  # torch 2.11-2.13's words, as they were seen
    ("RuntimeError: [/x/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms "
     "for recv operation to complete", 5.0),
    ("DistStoreError: wait timeout after 5000ms, keys: /default_pg/0//cpu//0/0", 5.0),
    ("DistStoreError: Timed out after 6 seconds waiting for clients. 3/4 clients joined.", 6.0),
    ("DistNetworkError: The client socket has timed out after 1500ms while trying to connect "
     "to (localhost, 36139).", 1.5),
    ("RuntimeError: [/x/gloo/transport/tcp/pair.cc:553] Connection closed by peer", None),
    ("ValueError: bad", None)])
def test_a_collective_that_timed_out_says_after_how_long(text: str,
                                                          seconds: float | None) -> None:
    assert timed_out_s(text) == seconds
    failure = Failure(0, 0, 75, text, 0.0)
    assert failure.describe().startswith(
        "node 0 rank 0 lost a peer" if seconds is None else
        "node 0 rank 0 timed out waiting for a peer")


def test_what_a_lost_peer_looks_like() -> None:
    from torch.distributed import DistNetworkError
    assert is_peer_loss(RuntimeError("[/x/gloo/transport/tcp/pair.cc:553] Connection closed "
                                     "by peer [127.0.0.1]:5"))
    assert is_peer_loss(DistNetworkError("store down"))
    try:
        try:
            raise DistNetworkError("gone")
        except DistNetworkError as exc:
            raise ValueError("wrapped") from exc
    except ValueError as exc:
        assert is_peer_loss(exc)
    assert not is_peer_loss(ValueError("Connection closed by peer"))  # a user's own
    assert not is_peer_loss(RuntimeError("shape mismatch"))
    assert exception_line({"message": "ValueError: x\ny", "extraInfo": {}}) == "ValueError: x"
    assert exception_line("RuntimeError: Error(s) in loading state_dict for Linear:\n\t"
                          "Unexpected key(s)") == "RuntimeError: Error(s) in loading " \
        "state_dict for Linear:"
    assert exception_line({"message": "AssertionError: "}) == "AssertionError"
    assert exception_line("To enable traceback see: https://...") == ""


def agents(tmp_path: Path, what: str, bad: int, *, nodes: int = 1, restarts: int = 3,
           extra: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess[str]]:
    """``nodes`` agents of 2 workers each running SCRIPT on this host, each to its end."""
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    port = free_port()
    procs = [subprocess.Popen(
        [PYTHON, "-m", "torchjob.trainer.agent", *extra, "--nnodes", str(nodes), "--nproc-per-node",
         "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
         "t", "--max-restarts", str(restarts), "--monitor-interval", "0.1", str(script), what,
         str(bad)], cwd=tmp_path, env=env_for_tests(PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(nodes)]
    done = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.send_signal(signal.SIGKILL)
            raise
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    return done


def closing(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.integration
def test_retry_on_error_restarts_flaky_user_code(tmp_path: Path) -> None:
    [proc] = agents(tmp_path, "flaky", 0, extra=("--retry-on-error",))
    assert proc.returncode == 0, proc.stdout
    assert "attempt 1" in proc.stdout and "finished 1" in proc.stdout


@pytest.mark.integration
def test_two_nodes_fail_together_on_a_bug_and_restart_together_on_a_kill(
        tmp_path: Path) -> None:
    """Rank 3 (node 1) raises: both nodes stop at once with exit 1, the other node naming
    it. Rank 3 killed: both restart and finish."""
    failed = agents(tmp_path, "raise", 3, nodes=2)
    assert [p.returncode for p in failed] == [1, 1], [p.stdout for p in failed]
    for proc in failed:
        assert "node 1 rank 3 raised ValueError: bad value at step 20" in closing(proc), \
            proc.stdout
        assert "attempt 1" not in proc.stdout
    killed = agents(tmp_path, "kill", 3, nodes=2)
    assert [p.returncode for p in killed] == [0, 0], [p.stdout for p in killed]
    for proc in killed:
        assert "finished" in proc.stdout and "attempt 1" in proc.stdout, proc.stdout


@pytest.mark.integration
def test_ranks_that_only_lost_peers_fail_the_job_with_its_line_when_no_restart_is_left(
        tmp_path: Path) -> None:
    """Every rank exits as if it lost a peer, on every attempt: one restart, then the job
    fails with the line that says so (not one more "restarting the workers")."""
    [proc] = agents(tmp_path, "peer", 0, restarts=1)
    assert proc.returncode == 1, proc.stdout
    assert "attempt 1" in proc.stdout and "attempt 2" not in proc.stdout, proc.stdout
    assert "lost a peer" in closing(proc) and "no restarts left (max_restarts: 1)" in \
        closing(proc), proc.stdout

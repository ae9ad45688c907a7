"""The local launcher with real torchrun agents and a tiny worker module (no trainer, no mocks).

The worker records its pid and its parent's (the torchrun agent); after the launcher ends,
none of those processes may be alive, whichever way it ended.
"""

from __future__ import annotations

import io
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchjob.jobs.backends.local.nodes import run_local
from torchjob.jobs.backends.local.render import LocalPlan
from torchjob.jobs.invocation import (EPHEMERAL_RANGE, LOW_PORTS, PICKS,
                                      free_port as find_free_port)
from torchjob.jobs.launcher import Stops
from torchjob.jobs.stops import stop_signals
from tests.procs import ROOT, TORCHJOB, Terminal, env_for_tests, stop_again, wait_for

pytestmark = pytest.mark.integration

WORKER = '''
import os, signal, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
mode = sys.argv[sys.argv.index("--mode") + 1]
with open(os.path.join(out, f"pid-{os.getpid()}"), "w") as f:
    f.write(str(os.getppid()))
# one write per line: the launcher runs workers with PYTHONUNBUFFERED=1 on one shared pipe,
# where print()'s separate writes of each piece interleave between ranks
sys.stdout.write(f"worker {os.environ['RANK']} of {os.environ['WORLD_SIZE']} up\\n")
sys.stdout.flush()
if mode in ("exit0", "exit1"):
    sys.exit(int(mode[-1]))
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "slow":  # a checkpoint that takes a moment
    def save(*_):
        time.sleep(2)
        open(os.path.join(out, f"saved-{os.getpid()}"), "w").close()
        sys.exit(143)
    signal.signal(signal.SIGTERM, save)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while True:
    time.sleep(0.05)
'''


def start(tmp_path: Path, mode: str, *, nodes: int = 1, nproc: int = 2, restarts: int = 0,
          extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    write_job(tmp_path, mode, nodes=nodes, nproc=nproc, restarts=restarts)
    return subprocess.Popen([*TORCHJOB, "run", "job.yaml", *extra], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def write_job(tmp_path: Path, mode: str, *, nodes: int = 1, nproc: int = 2,
              restarts: int = 0) -> None:
    (tmp_path / "tinyworker.py").write_text(WORKER)
    (tmp_path / "job.yaml").write_text(
        f"name: tiny\nnnodes: {nodes}\nnproc_per_node: {nproc}\nmax_restarts: {restarts}\n"
        f"env: {{PYTHONPATH: {os.pathsep.join([str(tmp_path), str(ROOT)])!r}}}\n"
        f"rdzv: {{join_timeout: 60}}\n"
        f"trainer: {{module: tinyworker, args: {{out: {str(tmp_path)!r}, mode: {mode}}}}}\n")


def recorded(tmp_path: Path) -> set[int]:
    """Every pid a worker wrote down: the workers and their torchrun agents."""
    pids = set()
    for path in tmp_path.glob("pid-*"):
        pids |= {int(path.name[4:]), int(path.read_text())}
    return pids


def wait_for_workers(tmp_path: Path, count: int, launcher: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("pid-*"))) < count:
        assert launcher.poll() is None, launcher.communicate()[0]
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def assert_all_gone(pids: set[int]) -> None:
    # a deadline for what never ends, not a speed: an agent's exit took over 5 s under load
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    assert not left, f"processes left behind 30 s after their job ended: {left}"


def finish(launcher: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        output, _ = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(launcher.pid, signal.SIGKILL)
        raise
    return launcher.returncode, output


@pytest.mark.parametrize("sig, nodes", [(signal.SIGINT, 1), (signal.SIGTERM, 2)])
def test_stop_signal_exits_143_and_leaves_nothing(tmp_path: Path, sig: int, nodes: int) -> None:
    launcher = start(tmp_path, "sleep", nodes=nodes, nproc=2 if nodes == 1 else 1)
    wait_for_workers(tmp_path, 2, launcher)
    pids = recorded(tmp_path)
    assert len(pids) == 2 + nodes  # workers + agents
    started = time.monotonic()
    launcher.send_signal(sig)
    code, output = finish(launcher)
    assert code == 143, output
    assert time.monotonic() - started < 30
    assert "torchjob: stopping" in output
    if nodes > 1:  # worker lines carry the one prefix (the agent's own: [node I])
        assert "[node 0 rank 0 attempt 0] worker" in output, output
        assert "[node 1 rank 1 attempt 0] worker" in output, output
    assert_all_gone(pids)


def test_workers_that_ignore_sigterm_are_killed_after_the_grace(tmp_path: Path) -> None:
    launcher = start(tmp_path, "stubborn", extra=("--grace", "1", "--set",
                                                  "checkpoint_budget=0.5"))
    wait_for_workers(tmp_path, 2, launcher)
    pids = recorded(tmp_path)
    launcher.send_signal(signal.SIGTERM)
    code, output = finish(launcher, timeout=30)
    assert code == 143 and "killing every node now" in output, output
    assert_all_gone(pids)


def test_second_ctrl_c_kills_at_once(tmp_path: Path) -> None:
    launcher = start(tmp_path, "stubborn")
    wait_for_workers(tmp_path, 2, launcher)
    pids = recorded(tmp_path)
    first = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    stop_again(launcher, first)
    started = time.monotonic()
    code, output = finish(launcher, timeout=30)
    assert code == 143 and time.monotonic() - started < 15, output
    assert_all_gone(pids)


def test_a_stop_before_the_nodes_start_starts_none_and_exits_143(tmp_path: Path) -> None:
    """A cancel that came before the launcher started its nodes (``perform`` counted it):
    no node starts, the launcher says so and ends with 143."""
    stops = Stops()
    stops.count = 1
    err = io.StringIO()
    plan = LocalPlan(commands=(("touch", str(tmp_path / "started")),), env={})
    assert run_local(plan, stops=stops, echo=False, err=err) == 143
    assert not (tmp_path / "started").exists()
    assert err.getvalue() == "torchjob: stopping: before any node started\n"


def test_one_stop_passed_on_by_a_wrapper_is_one_stop(tmp_path: Path) -> None:
    """`timeout 3h torchjob run ...` and Ctrl-C: the terminal's SIGINT reaches torchjob, and
    timeout sends it on; two stops that close together were a second Ctrl-C, and every node was
    killed before its checkpoint (1 time in 3 by hand). Here the two come as SIGINT and SIGTERM
    back to back (Python runs a handler once for two signals of one kind)."""
    launcher = start(tmp_path, "slow")
    wait_for_workers(tmp_path, 2, launcher)
    pids = recorded(tmp_path)
    launcher.send_signal(signal.SIGINT)
    launcher.send_signal(signal.SIGTERM)
    code, output = finish(launcher)
    assert code == 143, output
    assert "killing" not in output and len(list(tmp_path.glob("saved-*"))) == 2, output
    assert_all_gone(pids)


def test_a_hang_up_stops_the_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """The terminal closed (an ssh session dropped): the workers checkpoint and exit 143, as
    at Ctrl-C, and nothing is left. The hang-up killed torchjob, and its nodes, each in a
    session of its own, trained on headless and were never stopped."""
    write_job(tmp_path, "slow")
    terminal = Terminal([*TORCHJOB, "run", "job.yaml"], tmp_path, os.environ)
    try:
        wait_for_workers(tmp_path, 2, terminal.proc)
        pids = recorded(tmp_path)
        terminal.hang_up()
        code = terminal.proc.wait(timeout=60)
    finally:
        terminal.close()
    assert code == 143, terminal.text()
    assert len(list(tmp_path.glob("saved-*"))) == 2, terminal.text()
    assert_all_gone(pids)


def test_a_launcher_killed_outright_stops_its_job(tmp_path: Path) -> None:
    """`torchjob run` killed with SIGKILL (nothing of it runs to stop anything): each agent
    sees its launcher gone and stops as at a stop signal; the workers checkpoint, nothing is
    left. Its nodes, each in a session of its own, had trained on headless."""
    launcher = start(tmp_path, "slow")
    wait_for_workers(tmp_path, 2, launcher)
    pids = recorded(tmp_path)
    launcher.kill()
    launcher.wait()
    wait_for(lambda: len(list(tmp_path.glob("saved-*"))) == 2, 60,
             "both workers to checkpoint after their launcher was killed")
    assert_all_gone(pids)


def test_a_hang_up_ignored_stays_ignored() -> None:
    """Under nohup a hang-up is ignored: torchjob leaves it so, and counts none."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals() as stops:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert stops.count == 0 and not stops.hung_up
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_success_exits_0(tmp_path: Path) -> None:
    code, output = finish(start(tmp_path, "exit0"))
    assert code == 0, output
    assert "worker 0 of 2 up" in output and "worker 1 of 2 up" in output
    assert_all_gone(recorded(tmp_path))


def test_failure_exits_1_and_names_the_node(tmp_path: Path) -> None:
    code, output = finish(start(tmp_path, "exit1", restarts=0))
    assert code == 1 and "torchjob: node 0 failed" in output, output
    assert_all_gone(recorded(tmp_path))


def test_find_free_port() -> None:
    """Below the kernel's ephemeral range (no outgoing connection is given it before the
    store binds it), free, and not one already taken."""
    ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    port = find_free_port()
    assert LOW_PORTS.start <= port < min(LOW_PORTS.stop, ephemeral)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free
        sock.listen()
        assert find_free_port() != port  # one that something listens on is not given
    others = set(LOW_PORTS) - {port}
    # picked once, it is kept from the next picks for a while (until its agent binds it)
    assert find_free_port(taken=others) not in LOW_PORTS


def test_a_port_one_command_picked_is_not_picked_by_another(tmp_path: Path) -> None:
    """Two runs at once on one machine: each command is its own process, and the first one's
    port is not bound until its agent has started; the second never gets it. With two ports
    left to pick from, two commands get one each, and a third gets a port of the kernel's."""
    picked = PICKS.read_text().split() if PICKS.exists() else []  # lately, by other tests
    ports = set(random.sample([p for p in LOW_PORTS if str(p) not in picked and bindable(p)], 2))
    code = ("from torchjob.jobs.invocation import LOW_PORTS, free_port\n"
            f"print(free_port(taken=set(LOW_PORTS) - {ports}))")
    picks = [int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, env=env_for_tests(), timeout=60).stdout)
             for _ in range(3)]
    assert set(picks[:2]) == ports and picks[2] not in ports, (picks, ports)


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

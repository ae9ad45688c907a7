"""`python -m torchjob.trainer.agent`: torchrun's arguments, the trainer's exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.procs import (PYTHON, children, descendants, env_for_tests, free_port, last_step,
                         require_setup, wait_for)
from torchjob.trainer.agent import own_options
from torchjob.trainer import gpus
from torchjob.trainer.gpus import nproc_per_node, report
from torchjob.trainer.contract import STOP_SIGNALS, job_exit_code


@pytest.mark.parametrize("codes, expected", [({2}, 2), ({2, 1}, 2), ({143}, 143),
                                             ({143, 1}, 1), ({1}, 1), ({-9}, 1),
                                             ({200}, 200), ({200, 143}, 200), ({200, 1}, 1),
                                             ({200, 2}, 2)])
def test_exit_code_keeps_the_trainers_meaning(codes: set[int], expected: int) -> None:
    assert job_exit_code(codes) == expected


def test_torchruns_words_for_processes_per_node_are_counted_without_cuda_here() -> None:
    """``--nproc-per-node gpu|cpu|auto`` (a PyTorchJob's PET_NPROC_PER_NODE is ``auto``):
    the GPUs a fresh interpreter's torch sees (tests/integration/test_no_fork_after_cuda:
    the agent itself never asks), the CPUs this process may run on."""
    assert nproc_per_node("3") == "3"
    cpus = len(os.sched_getaffinity(0))
    assert nproc_per_node("cpu") == str(cpus)
    gpus = report()[2]
    assert nproc_per_node(" auto") == str(gpus or cpus)
    if not gpus:
        with pytest.raises(ValueError, match="--nproc-per-node gpu: torch sees no CUDA GPU on "
                           "this node: ask for GPUs"):
            nproc_per_node("gpu")
    with pytest.raises(ValueError, match="'many': write a count of processes per node, or gpu"):
        nproc_per_node("many")


def test_own_options_come_off_before_torchruns_in_any_order() -> None:
    argv = ["--run-dir", "r d", "--retry-on-error", "--checkpoint-dir", "c", "--nnodes", "1",
            "x.py", "--run-dir", "not ours"]
    assert own_options(argv) == (["--nnodes", "1", "x.py", "--run-dir", "not ours"],
                                 {"retry_on_error": True},
                                 {"TORCHJOB_RUN_DIR": "r d", "TORCHJOB_CHECKPOINT_DIR": "c"})
    assert own_options(["--max-stalled-restarts", "0", "--nnodes", "1"]) == (
        ["--nnodes", "1"], {"max_stalled_restarts": 0}, {})
    assert own_options(["--expect-gpus", "8", "--nnodes", "1"]) == (
        ["--nnodes", "1"], {"gpus": 8}, {})
    assert own_options(["--nnodes", "1"]) == (["--nnodes", "1"], {}, {})
    assert own_options(["--run-dir"]) == (["--run-dir"], {}, {})  # torchrun says what's wrong
    with pytest.raises(ValueError, match="--max-stalled-restarts 'x': must be a whole number"):
        own_options(["--max-stalled-restarts", "x"])


def agent(run_dir: Path, *args: str) -> list[str]:
    return [PYTHON, "-m", "torchjob.trainer.agent", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0", "-m", "torchjob.trainer", "--run-dir", str(run_dir),
            "--progress", "lines", *args]


@pytest.mark.integration
def test_a_config_error_in_the_workers_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(agent(tmp_path, "--sync-bn", "true"), env=env_for_tests(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.parametrize("nproc", ["2", "gpu"])
def test_gpus_the_job_asked_for_but_the_node_lacks_stop_it_before_any_worker(
        tmp_path: Path, nproc: str) -> None:
    """``--expect-gpus`` (resources.gpus, on every backend that asks for them): a node
    that sees fewer (a container engine that ignored the reservation) exits 2 with the fix,
    where the job would have trained on the CPU; with ``gpu`` too, whose own refusal would
    tell the user to ask for GPUs. CUDA_VISIBLE_DEVICES hides any GPU here."""
    argv = agent(tmp_path)
    argv[argv.index("--nproc-per-node") + 1] = nproc
    proc = subprocess.run([*argv[:3], "--expect-gpus", "1", *argv[3:]],
                          env=env_for_tests(CUDA_VISIBLE_DEVICES=""), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    version, gpu_build, _ = report()
    assert "the job asks for 1 GPU(s) per node (resources.gpus), but torch " in last, last
    assert (f"torch {version} on " in last and "is built for the CPU alone" in last) if not \
        gpu_build else "(CUDA_VISIBLE_DEVICES=): the scheduler or container engine did " in last
    assert last.endswith("resources.gpus: 0 to train on the CPU (attempt 0, exit 2)"), last
    assert not (tmp_path / "metrics.jsonl").exists()  # no worker started


def test_what_a_node_without_the_gpus_asked_for_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU build of torch is said first (no engine could help it); else the devices seen."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for found, told in ((("2.9.0+cpu", False, 0), "torch 2.9.0+cpu on "),
                        (("2.9.0+cu128", True, 1), "torch sees 1 on ")):
        monkeypatch.setattr(gpus, "report_here", lambda found=found: found)
        assert gpus.missing(0) == "" and gpus.missing(found[2]) == ""
        said = gpus.missing(2)
        assert said.startswith(f"the job asks for 2 GPU(s) per node (resources.gpus), but {told}")
        assert ("is built for the CPU alone: run an image or environment with a CUDA build"
                in said) != found[1], said
        assert ("(CUDA_VISIBLE_DEVICES=0): the scheduler or container engine did not give "
                "them" in said) == found[1], said


@pytest.mark.integration
@pytest.mark.parametrize("group", [False, True], ids=["agent", "process-group"])
def test_sigterm_to_the_agent_exits_143_after_a_checkpoint(tmp_path: Path, group: bool) -> None:
    """SIGTERM to the agent, or to its whole process group at once, as TorchX's local
    scheduler and scancel send it: the workers, and the server they are forked from, hear
    one stop, checkpoint and exit 143."""
    proc = subprocess.Popen(agent(tmp_path, "--epochs", "30", "--log-every", "1"),
                            env=env_for_tests(), stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for(lambda: last_step(tmp_path) >= 10 or proc.poll() is not None, 120, "step 10")
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in err
    assert list((tmp_path / "checkpoints").glob("step_*"))


STOP_AT_EVAL = ("--task", "tests.trainer.stop_at_eval:task")


def stopping_itself(run_dir: Path, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """ARGV, started so that tests.trainer.stop_at_eval sends SIGTERM to ARGV's own process
    (a shell exports its pid as STOP_PID and execs ARGV), and the environment for it."""
    return (["bash", "-c", 'STOP_PID=$$ exec "$@"', "bash", *argv],
            env_for_tests(STOP_MARKER=str(run_dir / "stop-sent")))


@pytest.mark.integration
def test_a_stop_after_the_last_step_ends_the_workers_at_once(tmp_path: Path) -> None:
    """SIGTERM to the agent while its workers run the final evaluation (after their last
    stop check): they finish the work and its final checkpoint, then exit 143 at once, not
    after torchrun's 30 s shutdown timeout; the next run resumes there and ends with 0."""
    args = ("--epochs", "2", "--eval-every", "0")
    argv, env = stopping_itself(tmp_path, agent(tmp_path, *STOP_AT_EVAL, *args))
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert (tmp_path / "stop-sent").exists(), err[-2000:]
    assert proc.returncode == 143, err[-3000:]
    assert err.count("SIGTERM arrived after the last step: the work is done") == 2, err[-3000:]
    assert "Unable to shutdown process" not in err  # torchrun's SIGKILL after its timeout
    assert "grace" not in err
    steps = json.loads((tmp_path / "summary.json").read_text())["steps"]
    # the same task (a checkpoint of another is refused); its stop marker is taken already
    again = subprocess.run(agent(tmp_path, *STOP_AT_EVAL, *args), env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resumed from step_{steps:08d}" in again.stderr
    assert f"training {steps} steps" in again.stderr and f"from step {steps}" in again.stderr


@pytest.mark.integration
def test_a_stop_after_the_last_step_without_an_agent_exits_0(tmp_path: Path) -> None:
    """The same signal to a trainer that no agent runs (srun, a plain process): the work
    is done, so 0, and the log says the signal came late."""
    argv, env = stopping_itself(tmp_path, [PYTHON, "-m", "torchjob.trainer", "--run-dir",
                                           str(tmp_path), "--progress", "lines", *STOP_AT_EVAL,
                                           "--epochs", "1", "--eval-every", "0"])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert (tmp_path / "stop-sent").exists(), proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SIGTERM arrived after the last step: the work is done" in proc.stderr
    assert (tmp_path / "summary.json").exists()


NODE_SCRIPT = """\
import os, time
time.sleep(0 if os.environ["GROUP_RANK"] == "0" else 600)
"""


def node_agent(port: int, rdzv_id: str, log: Path, *args: str,
               **env: str) -> subprocess.Popen[str]:
    """One "node" on this host: an agent with 1 process in the c10d rendezvous at PORT, its
    stderr (torchrun's INFO log and the workers' lines) to LOG."""
    return subprocess.Popen(
        [PYTHON, "-m", "torchjob.trainer.agent", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id, *args],
        env=env_for_tests(LOGLEVEL="INFO", **env), stderr=log.open("w"), text=True)


def end_all(procs: Iterable[subprocess.Popen[str]]) -> None:
    """Kill whatever of PROCS still runs (a stopped one too) with its workers (torchrun starts
    each in a session of its own, so they outlive their agent) and reap them all."""
    for proc in procs:
        if proc.poll() is None:
            for pid in [*descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait()


@pytest.mark.integration
def test_a_stop_signal_ends_the_wait_for_the_other_nodes(tmp_path: Path) -> None:
    """Two agents (two "nodes"); node 0's work ends at once, node 1's does not. Node 0's
    agent waits for node 1 at the end (torchrun's exit barrier, up to 300 s in one blocking
    store call that signals cannot interrupt); SIGTERM there ends it at once with 143."""
    script = tmp_path / "node.py"
    script.write_text(NODE_SCRIPT)
    port = free_port()
    logs = [tmp_path / f"agent{i}.log" for i in range(2)]
    agents = [node_agent(port, "barrier-test", log, "--nnodes", "2", "--node-rank", str(i),
                         "--max-restarts", "0", str(script))
              for i, log in enumerate(logs)]
    try:
        wait_for(lambda: "waiting up to 300 s for the other nodes" in logs[0].read_text()
                 or agents[0].poll() is not None, 120, "node 0 at the exit barrier")
        agents[0].send_signal(signal.SIGTERM)
        try:
            code = agents[0].wait(timeout=20)  # torch's own barrier: 300 s
        except subprocess.TimeoutExpired:
            pytest.fail("node 0's agent still waits for node 1 after SIGTERM:\n"
                        + logs[0].read_text()[-2000:])
        assert code == 143, logs[0].read_text()[-2000:]
        assert "SIGTERM while waiting for the other nodes: stopping" in logs[0].read_text()
    finally:
        end_all(agents)


@pytest.mark.integration
def test_sigterm_before_the_workers_start_ends_the_agent_even_as_pid_1(tmp_path: Path) -> None:
    """The agent as the first process of a PID namespace (as in a container or a pod, where
    the kernel drops a signal that process has no handler for) waits in the rendezvous for a
    node that never comes: torch's agent has no handler yet (it installs one as it starts
    the workers); SIGTERM from outside ends it at once with 143."""
    require_setup(["unshare", "--pid", "--fork", "true"], timeout=30,
                  what="a PID namespace (unshare --pid needs root)")
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", PYTHON, "-m", "torchjob.trainer.agent",
         "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         f"127.0.0.1:{free_port()}", "--rdzv-id", "pid1-test", "-m", "torchjob.trainer"],
        env=env_for_tests(LOGLEVEL="INFO"), stderr=log.open("w"), text=True)
    try:
        agent = wait_for(lambda: children(proc.pid), 30, "unshare's child, the agent")[0]
        wait_for(lambda: "Rendezvous'ing worker group" in log.read_text()
                 or proc.poll() is not None, 120, "the agent in the rendezvous")
        os.kill(agent, signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)  # without a handler: the join timeout, 900 s
        except subprocess.TimeoutExpired:
            pytest.fail("the agent still waits in the rendezvous after SIGTERM:\n"
                        + log.read_text()[-2000:])
        assert code == 143, log.read_text()[-2000:]
    finally:
        end_all([proc])


# a stop in the agent's first seconds, at the three moments where one was lost (found by a
# Slurm cancel right after submit, which ended SUCCEEDED or after 300 s instead of 143)

CAUGHT_IN_IMPORT = """
import os, signal
from torchjob.trainer.agent import exit_at_once
signal.signal(signal.SIGTERM, exit_at_once)  # as the agent's __main__, before importing torch
try:  # an import that catches everything (numpy's does)
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(10**6))
except BaseException:
    pass
print("went on")
"""


def test_a_stop_during_the_agents_imports_ends_it_even_where_an_import_catches_it() -> None:
    """Raised as SystemExit, the stop was caught inside numpy's import: the agent went on with
    modules half imported, and its workers failed at the run's end."""
    proc = subprocess.run([PYTHON, "-c", CAUGHT_IN_IMPORT], capture_output=True, text=True,
                          env=env_for_tests(), timeout=60)
    assert (proc.returncode, proc.stdout) == (143, ""), proc.stdout + proc.stderr


STOPPED_AS_THE_SERVER_STARTS = """
import json, os, signal
import multiprocessing.forkserver as forkserver
from torchjob.trainer import agent
heard = []
signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
agent.PRELOAD = []  # the server alone, not the trainer's imports
start = forkserver.ensure_running
def stopped_meanwhile():
    os.kill(os.getpid(), signal.SIGTERM)
    start()
forkserver.ensure_running = stopped_meanwhile
agent.start_forkserver()
print(json.dumps({"heard": heard, "server": forkserver._forkserver._forkserver_pid}))
"""


def signal_set(pid: int, field: str) -> set[int]:
    """The signals in ``field`` (SigIgn, SigBlk, ...) of /proc/PID/status."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                if x.startswith(field + ":"))
    mask = int(line.split()[1], 16)
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}


def test_a_stop_while_the_fork_server_starts_is_heard_and_the_server_stays_deaf() -> None:
    """Ignored while the server was forked, a stop then was lost and the run went on to its
    end; blocked instead, it is heard once the server runs, and the server (and the workers it
    forks, until they set their own handlers) ignore stops without blocking them."""
    proc = subprocess.Popen([PYTHON, "-c", STOPPED_AS_THE_SERVER_STARTS + "input()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env_for_tests())
    try:
        assert proc.stdout is not None
        seen = json.loads(proc.stdout.readline())
        assert seen["heard"] == [signal.SIGTERM], seen
        stops = {int(s) for s in STOP_SIGNALS}
        wait_for(lambda: stops <= signal_set(seen["server"], "SigIgn"), 30,
                 "the server to ignore stops (first thing, while they are blocked)")
        assert not stops & signal_set(seen["server"], "SigBlk"), "the server blocks stops"
        assert not stops & signal_set(proc.pid, "SigBlk"), "the agent still blocks stops"
    finally:
        proc.kill()
        proc.wait()


def in_session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (the agent's: its server and workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] not in "ZX":
            found.append(int(entry.name))
    return found


def first_fork(agent_pid: int) -> bool:
    """A worker forked yet: a child of one of the agent's children (its fork server)."""
    return any(children(kid) for kid in children(agent_pid))


@pytest.mark.integration
def test_a_stop_as_the_workers_start_ends_the_agent_at_once_with_nothing_left(
        tmp_path: Path) -> None:
    """SIGTERM the moment the first worker is forked, while torch is still starting them: the
    workers it had started were in no context of torch's, and the agent's exit waited on one
    until that worker's rendezvous timed out (300 s)."""
    proc = subprocess.Popen(agent(tmp_path, "--epochs", "30"), env=env_for_tests(),
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not first_fork(proc.pid):  # no sleep: the moment is a few milliseconds long
            assert proc.poll() is None and time.monotonic() < deadline, \
                f"no worker forked (agent exit {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the agent still runs 60 s after SIGTERM: {descendants(proc.pid)}")
        assert proc.returncode == 143, err[-2000:]
        wait_for(lambda: not in_session(proc.pid), 30, "no process left of the agent's session")
    finally:
        end_all([proc])


def elastic_node(run_dir: Path, port: int, log: Path) -> subprocess.Popen[str]:
    """One "node" of an elastic 1:2 job on this host, 1 process, a slow step while alone.
    Heartbeats every 1 s, a node unseen for 4 s is dropped (torch: 5 s x 3)."""
    return node_agent(
        port, "membership-test", log, "--nnodes", "1:2", "--rdzv-conf",
        "join_timeout=120,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=4",
        "--max-restarts", "3", "--monitor-interval", "0.1",
        "-m", "torchjob.trainer", "--run-dir", str(run_dir),
        "--task", "tests.containers.slow_alone:task",
        "--batch-size", "8", "--epochs", "1", "--checkpoint-every", "50", "--eval-every", "0",
        "--log-every", "10", "--progress", "lines", SLOW_ALONE_BELOW="2")


@pytest.mark.integration
def test_a_node_dropped_from_its_round_rejoins_rather_than_train_on_alone(
        tmp_path: Path) -> None:
    """Node A trains alone (nnodes 1:2) and hosts the rendezvous store. Its agent stalls
    (SIGSTOP: no heartbeat, no store) while node B starts; when the store answers again, B
    finds A's heartbeat too old, drops A and opens a new round. torch's agent on A would
    train on alone beside B's new group (a split brain on one checkpoint directory, seen in
    the elastic container test). A's agent sees that it was dropped and restarts its workers
    into the next round: the job ends as one group of 2."""
    run_dir, port = tmp_path / "run", free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    nodes = {"a": elastic_node(run_dir, port, logs["a"])}
    try:
        wait_for(lambda: last_step(run_dir) >= 20 or nodes["a"].poll() is not None, 120,
                 "node A training alone")
        nodes["a"].send_signal(signal.SIGSTOP)
        nodes["b"] = elastic_node(run_dir, port, logs["b"])
        time.sleep(10)  # B is up and blocked on the store; A's heartbeat grows stale
        nodes["a"].send_signal(signal.SIGCONT)
        codes = {name: proc.wait(timeout=300) for name, proc in nodes.items()}
    finally:
        end_all(nodes.values())
    out = {name: log.read_text() for name, log in logs.items()}
    assert codes == {"a": 0, "b": 0}, out["a"][-3000:] + out["b"][-3000:]
    assert "restarting the workers to join the next round" in out["a"], out["a"][-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    alone_after_the_stall = [line for line in out["b"].splitlines()
                             if "joined:" in line and "world_size 1 " in line]
    assert not alone_after_the_stall, out["b"][-3000:]


LOST_IN_A_FINALIZER = """
import gc, os, signal
from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler
from torchjob.trainer import stop_heard
signal.signal(signal.SIGTERM, _terminate_process_handler)  # torch's, as it starts the workers
stop_heard.remember()
stop_heard.remember()  # once: a handler is wrapped one time only
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # heard here, where Python ignores what it raises
        for _ in range(1000):
            pass
Finalized()
gc.collect()
print("went on", flush=True)
try:
    stop_heard.raise_if_heard()
except SignalException as exc:
    print("raised again:", exc.sigval.name)
"""


def test_a_stop_whose_exception_was_lost_is_raised_again() -> None:
    """torch's handler raises SignalException wherever the main thread is: in a finalizer,
    Python ignores it and goes on (a stop seen once in CI, sent as the first worker was forked,
    let the job train to its end). The agent raises it again at its next look."""
    proc = subprocess.run([PYTHON, "-c", LOST_IN_A_FINALIZER], capture_output=True, text=True,
                          env=env_for_tests(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "went on\nraised again: SIGTERM\n", (proc.stdout, proc.stderr)
    assert "Exception ignored in" in proc.stderr, proc.stderr  # where it was lost before

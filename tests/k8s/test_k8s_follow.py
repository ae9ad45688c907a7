"""`torchjob run --to k8s` and `torchjob logs --follow` follow the pods' logs while the job runs:
real processes and real HTTP against the API EMULATOR (tests/k8s/emulator.py), since no API
server can run on these machines. The test plays the operator and the kubelet, and moves on
only when the output it waits for has shown (no sleeps); every wait has a deadline."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
from hypothesis import given, strategies as st

from torchjob.k8s.backend import STATES
from torchjob.k8s.client import ENDED, readable_run
from torchjob.k8s.follow import labelled, node_rank, split_lines, unstamped
from tests.k8s.emulator import Emulator
from tests.procs import ROOT, TORCHJOB, env_for_tests, stop_again
from torchjob.trainer.contract import log_prefix

JOB = ("pytorchjobs", "default", "digits")
SPEC = "jobs/examples/default.yaml"
WAIT_S = 60.0


def labels(kind: str, index: int) -> dict[str, str]:
    return {"training.kubeflow.org/job-name": "digits",
            "training.kubeflow.org/replica-type": kind,
            "training.kubeflow.org/replica-index": str(index)}


class Torchjob:
    """``python -m torchjob.jobs ARGV`` running against the emulator, its output read as it
    comes."""

    def __init__(self, config: str, *argv: str) -> None:
        self.argv = argv
        self.proc = subprocess.Popen([*TORCHJOB, *argv], cwd=ROOT,
                                     env=env_for_tests(KUBECONFIG=config),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, encoding="utf-8")
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.seen = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(pipe, lines), daemon=True)
                        for pipe, lines in ((self.proc.stdout, self.stdout),
                                            (self.proc.stderr, self.stderr))]
        for reader in self.readers:
            reader.start()

    def _read(self, pipe: Any, lines: list[str]) -> None:
        for line in pipe:
            with self.seen:
                lines.append(line.rstrip("\n"))
                self.seen.notify_all()

    def saw(self) -> str:
        return (f"`torchjob {' '.join(self.argv)}` printed so far:\n  stdout: {self.stdout}\n"
                f"  stderr: {self.stderr}\n  exit code: {self.proc.poll()}")

    def expect(self, line: str, timeout: float = WAIT_S) -> None:
        """Until ``line`` is on stdout; it must show while the command still runs."""
        with self.seen:
            if not self.seen.wait_for(lambda: line in self.stdout, timeout):
                raise AssertionError(f"{line!r} did not show within {timeout}s; {self.saw()}")
        assert self.proc.poll() is None, f"it exited after {line!r}; {self.saw()}"

    def exit_code(self, timeout: float = WAIT_S) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"it did not end within {timeout}s; {self.saw()}") from None
        for reader in self.readers:
            reader.join(timeout)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator() as emu:
        emu.config = emu.kubeconfig(tmp_path / "kubeconfig")  # type: ignore[attr-defined]
        yield emu


@pytest.fixture
def torchjob(emulator: Emulator) -> Iterator[Any]:
    started: list[Torchjob] = []

    def start(*argv: str) -> Torchjob:
        started.append(Torchjob(emulator.config, *argv))  # type: ignore[attr-defined]
        return started[-1]
    yield start
    for proc in started:
        proc.close()


def submitted(emulator: Emulator) -> None:
    emulator.wait(lambda: JOB in emulator.objects, WAIT_S, f"the PyTorchJob {JOB} to be created")


def refused_reads(emulator: Emulator) -> list[tuple[str, bool, int]]:
    return [read for read in emulator.log_reads if read[2] != 200]


@pytest.mark.parametrize("succeeded, code", [(True, 0), (False, 1)])
def test_run_prints_lines_while_the_job_runs(emulator: Emulator, torchjob: Any,
                                             succeeded: bool, code: int) -> None:
    emulator.chunk_size = 3  # every line comes cut, some inside a UTF-8 character
    run = torchjob("run", "--to", "k8s", SPEC)
    submitted(emulator)
    emulator.add_pod("default", "digits-master-0", labels("master", 0), "step 1 loss ½\n")
    run.expect("[node 0] step 1 loss ½")
    emulator.append_log("default", "digits-master-0", "step 2 — €\n")
    run.expect("[node 0] step 2 — €")  # while the job runs: it is not finished yet
    assert "status" not in emulator.objects[JOB] or all(
        c["type"] not in ENDED for c in emulator.objects[JOB]["status"]["conditions"])
    emulator.finish("default", "digits", succeeded=succeeded)
    assert run.exit_code() == code, run.saw()
    assert run.stdout == ["[node 0] step 1 loss ½", "[node 0] step 2 — €"], run.saw()
    assert run.stderr == ["torchjob: submitted k8s:default/digits"], run.saw()
    assert ("digits-master-0", True, 200) in emulator.log_reads  # a followed stream
    assert not refused_reads(emulator)


def test_run_follows_pods_that_come_later_and_restarted_containers(
        emulator: Emulator, torchjob: Any) -> None:
    run = torchjob("run", "--to", "k8s", SPEC)
    submitted(emulator)
    emulator.add_pod("default", "digits-master-0", labels("master", 0), "master run 0\n")
    run.expect("[node 0] master run 0")

    # a pod that comes later, seen while its container is created: not read before it runs
    emulator.add_pod("default", "digits-worker-0", labels("worker", 0), waiting=True)
    lists = emulator.pod_lists
    emulator.wait(lambda: emulator.pod_lists >= lists + 2, WAIT_S,
                  f"two more pod listings after worker-0 was added (saw {emulator.pod_lists})")
    emulator.start("default", "digits-worker-0")
    emulator.append_log("default", "digits-worker-0", "worker run 0\n")
    run.expect("[node 1] worker run 0")

    # the container restarts (restartCount 1) with a new log
    emulator.restart("default", "digits-master-0", "master run 1\n")
    run.expect("[node 0] master run 1")

    # the pod is recreated: same name, another uid
    emulator.remove_pod("default", "digits-worker-0")
    emulator.add_pod("default", "digits-worker-0", labels("worker", 0), "worker recreated\n")
    run.expect("[node 1] worker recreated")
    emulator.append_log("default", "digits-master-0", "master last\n")
    run.expect("[node 0] master last")

    emulator.finish("default", "digits")
    assert run.exit_code() == 0, run.saw()
    assert run.stdout == ["[node 0] master run 0", "[node 1] worker run 0",
                          "[node 0] master run 1", "[node 1] worker recreated",
                          "[node 0] master last"], run.saw()  # each line once
    assert not refused_reads(emulator), emulator.log_reads


def test_logs_follow_of_a_finished_job_prints_everything_once(emulator: Emulator,
                                                             torchjob: Any) -> None:
    assert torchjob("submit", "--to", "k8s", SPEC).exit_code() == 0
    emulator.add_pod("default", "digits-master-0", labels("master", 0), "m1\nm2\n")
    emulator.add_pod("default", "digits-worker-0", labels("worker", 0), "w old\n")
    emulator.restart("default", "digits-worker-0", "w1\nw2 without a newline")
    emulator.finish("default", "digits")
    follow = torchjob("logs", "--follow", "k8s:default/digits")
    assert follow.exit_code() == 0, follow.saw()
    once = torchjob("logs", "k8s:default/digits")
    assert once.exit_code() == 0, once.saw()
    for prefix, lines in (("[node 0]", ["m1", "m2"]), ("[node 1]", ["w1", "w2 without a "
                                                                          "newline"])):
        assert [x for x in follow.stdout if x.startswith(prefix)] == \
            [f"{prefix} {line}" for line in lines], follow.saw()
    assert sorted(follow.stdout) == sorted(once.stdout) and len(follow.stdout) == 4, \
        (follow.saw(), once.saw())
    assert not refused_reads(emulator), emulator.log_reads


def test_ctrl_c_stops_following_logs_cleanly(emulator: Emulator, torchjob: Any) -> None:
    assert torchjob("submit", "--to", "k8s", SPEC).exit_code() == 0
    proc = torchjob("logs", "-f", "k8s:default/digits")
    emulator.add_pod("default", "digits-master-0", labels("master", 0), "training\n")
    proc.expect("[node 0] training")
    proc.proc.send_signal(signal.SIGINT)
    assert proc.exit_code() == 130, proc.saw()
    assert not any("Traceback" in line for line in proc.stderr), proc.saw()
    assert JOB in emulator.objects  # following the logs stops nothing


@pytest.mark.parametrize("twice", [False, True])
def test_ctrl_c_of_a_run_cancels_the_job_as_on_every_backend(emulator: Emulator, torchjob: Any,
                                                             twice: bool) -> None:
    """The first Ctrl-C deletes the job (its pods get SIGTERM: the workers checkpoint) and
    goes on following it to its end, exit 143; a second one leaves it stopping, exit 143."""
    run = torchjob("run", "--to", "k8s", SPEC)
    submitted(emulator)
    emulator.add_pod("default", "digits-master-0", labels("master", 0), "training\n")
    run.expect("[node 0] training")
    first = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    emulator.wait(lambda: JOB not in emulator.objects, WAIT_S,
                  f"the PyTorchJob to be deleted; {run.saw()}")
    cancelled = "torchjob: deleted PyTorchJob default/digits; Ctrl-C again to stop waiting"
    with run.seen:
        assert run.seen.wait_for(lambda: cancelled in run.stderr, WAIT_S), run.saw()
    if twice:
        stop_again(run.proc, first)
        assert run.exit_code() == 143, run.saw()
        assert run.stderr[-1].startswith("torchjob: k8s:default/digits goes on stopping on "
                                         "its own"), run.saw()
        emulator.terminate("default", "digits-master-0")
    else:
        emulator.terminate("default", "digits-master-0", "checkpoint saved; exit 143\n")
        assert run.exit_code() == 143, run.saw()
        assert run.stdout[-1] == "[node 0] checkpoint saved; exit 143", run.saw()
    assert not any("Traceback" in line for line in run.stderr), run.saw()


def test_errors_while_following_are_one_line_and_exit_2(emulator: Emulator,
                                                        torchjob: Any) -> None:
    missing = torchjob("logs", "-f", "k8s:default/nope")
    assert missing.exit_code() == 2 and len(missing.stderr) == 1, missing.saw()
    assert "HTTP 404" in missing.stderr[0], missing.saw()
    run = torchjob("run", "--to", "k8s", SPEC)
    submitted(emulator)
    emulator.add_pod("default", "digits-master-0", labels("master", 0), "training\n")
    run.expect("[node 0] training")
    emulator.forbidden = True  # the next look at the job is refused
    assert run.exit_code() == 2, run.saw()
    assert "HTTP 403" in run.stderr[-1] and "RBAC" in run.stderr[-1], run.saw()
    assert len(run.stderr) == 2 and not any("Traceback" in x for x in run.stderr), run.saw()


@given(st.text(st.sampled_from("ab\n\r é€😀")), st.lists(st.integers(0, 40), max_size=8))
def test_lines_cut_anywhere_come_out_as_splitlines_cuts_them(text: str, cuts: list[int]) -> None:
    data = text.encode()
    points = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
    assert list(split_lines(pieces)) == text.splitlines()


def test_which_run_of_a_container_can_be_read() -> None:
    def pod(restarts: int, state: dict[str, Any], last: dict[str, Any]) -> Any:
        status = NS(name="pytorch", restart_count=restarts, state=NS(**state),
                    last_state=NS(**last))
        return NS(metadata=NS(name="p", uid="u"), status=NS(container_statuses=[status]))
    none = {"running": None, "terminated": None, "waiting": None}
    creating = pod(0, {**none, "waiting": NS(reason="ContainerCreating")}, none)
    assert readable_run(creating, "pytorch", 0) is None
    running = readable_run(pod(2, {**none, "running": NS()}, none), "pytorch", 0)
    assert running is not None and running.key == ("u", 2)
    # crashed, waiting to restart: the kubelet serves the run that ended, still number 2
    backoff = pod(2, {**none, "waiting": NS(reason="CrashLoopBackOff")},
                  {**none, "terminated": NS(exit_code=1)})
    crashed = readable_run(backoff, "pytorch", 0)
    assert crashed is not None and crashed.key == ("u", 2)
    assert readable_run(NS(metadata=NS(name="p", uid="u"), status=NS(container_statuses=None)),
                        "pytorch", 0) is None


def test_the_conditions_that_end_following_are_the_terminal_states() -> None:
    assert set(ENDED) == {condition for condition, state in STATES.items() if state.terminal}


def test_lines_are_labelled_by_node_rank_as_on_every_backend() -> None:
    """A worker's line keeps the agent's prefix; a pod's own line gets its node rank."""
    assert [node_rank("master", 0, True), node_rank("worker", 0, True),
            node_rank("Worker", 4, True)] == [0, 1, 5]  # PET_NODE_RANK of a PyTorchJob
    assert node_rank("worker", 3, False) == 3  # Worker-only (elastic)
    assert node_rank("node", 2, False) == 2  # TrainJob: the Job completion index
    worker = log_prefix(1, 3, 0) + "step 1 loss 0.5"
    assert labelled(1, worker) == worker
    assert labelled(1, "waiting for j-rdzv to resolve") == "[node 1] waiting for j-rdzv to resolve"
    assert labelled(0, "[node 0] x") == "[node 0] [node 0] x"  # not a worker's prefix


def test_worker_lines_come_through_with_their_own_prefix(emulator: Emulator,
                                                         torchjob: Any) -> None:
    assert torchjob("submit", "--to", "k8s", SPEC).exit_code() == 0
    emulator.add_pod("default", "digits-master-0", labels("master", 0),
                     "torchjob: agent up\n[node 0 rank 1 attempt 2] step 3\n")
    emulator.add_pod("default", "digits-worker-0", labels("worker", 0),
                     "[node 1 rank 2 attempt 2] step 3\n")
    emulator.finish("default", "digits")
    once = torchjob("logs", "k8s:default/digits")
    assert once.exit_code() == 0, once.saw()
    assert once.stdout == ["[node 0] torchjob: agent up", "[node 0 rank 1 attempt 2] step 3",
                           "[node 1 rank 2 attempt 2] step 3"], once.saw()


def test_a_kubelet_stamp_is_read_off_its_line() -> None:
    """``timestamps=true``: RFC 3339 with 0-9 digits of a second (Go's RFC3339Nano), Z or an
    offset; a line without one, or with a date that is none, is left whole."""
    at = 1795799604.0  # 2026-11-27T17:13:24Z
    assert unstamped("2026-11-27T17:13:24.123456789Z [node 0] x") == (at + 0.123456789,
                                                                       "[node 0] x")
    assert unstamped("2026-11-27T17:13:24Z hello") == (at, "hello")
    assert unstamped("2026-11-27T18:13:24+01:00 y") == (at, "y")
    assert unstamped("2026-11-27T17:13:24.5Z ") == (at + 0.5, "")
    for whole in ("hello", "2026-13-27T17:13:24Z z", "17:13:24 [rank 0/4] step 1/2"):
        assert unstamped(whole) == (None, whole)

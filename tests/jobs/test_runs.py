"""The run registry (jobs.runs, jobs.launcher) without a real run: the index, the state of a
launcher that died without its result, a reused pid, logs that end with the run, the node line
prefix, a stop that comes before the launcher looks."""

from __future__ import annotations

import io
import os
import signal
import subprocess
from pathlib import Path

import pytest

from torchjob.jobs import launcher, runs
from torchjob.jobs.backend import BackendError, Handle, State
from torchjob.jobs.values import UserError


@pytest.fixture(autouse=True)
def own_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def record(tmp_path: Path, run_id: str = "tiny-1a2b3c") -> runs.Record:
    return runs.create("local", run_id, tmp_path / "runs" / "tiny", name="tiny",
                       request={"text": "python -m torchjob.trainer.agent ...\n"})


def dead_process() -> runs.Proc:
    """A process that existed and has ended (its pid and start time as a launcher's)."""
    proc = subprocess.Popen(["sleep", "60"])
    found = runs.Proc.of(proc.pid)
    proc.kill()
    proc.wait()
    assert found is not None
    return found


def test_a_record_is_found_from_anywhere_and_listed_newest_first(tmp_path: Path) -> None:
    first, second = record(tmp_path, "tiny-000001"), record(tmp_path, "tiny-000002")
    first.update(created=1.0)
    assert runs.find("local", "tiny-000001").path == first.path
    assert first.path == tmp_path / "runs" / "tiny" / ".torchjob" / "tiny-000001"
    assert (tmp_path / "state" / "torchjob" / "runs" / "local" / "tiny-000002").is_file()
    assert [r.path for r in runs.records("local")] == [second.path, first.path]
    assert runs.find("local", "tiny-000001", log_dir=str(tmp_path / "runs" / "tiny")).path \
        == first.path  # once the index has forgotten it: from the run directory
    with pytest.raises(UserError, match="no local run 'tiny-ffffff' on this machine"):
        runs.find("local", "tiny-ffffff")
    with pytest.raises(BackendError, match="is not a run id"):
        runs.find("local", "../../etc")
    with pytest.raises(UserError, match="exists already"):
        record(tmp_path, "tiny-000001")


def test_a_launcher_that_died_without_its_result_is_failed_not_running(tmp_path: Path) -> None:
    rec = record(tmp_path)
    handle = Handle("local", "tiny-1a2b3c")
    assert runs.status(rec, handle).state is State.PENDING  # this process, alive
    rec.launched()
    assert runs.status(rec, handle).state is State.RUNNING
    rec.update(launcher=dead_process().__dict__)
    found = runs.status(rec, handle)
    assert found.state is State.FAILED and found.exit_code is None, found
    assert "ended without writing the run's result" in found.detail
    with pytest.raises(UserError, match="ended without writing"):
        runs.cancel(rec, handle)


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    """The recorded launcher's pid now belongs to another process (here: this test's, with
    another start time): it is not the launcher, and cancel sends it nothing."""
    rec = record(tmp_path)
    me = runs.Proc.of(os.getpid())
    assert me is not None and me.alive()
    rec.update(state="RUNNING", launcher={**me.__dict__, "start": str(int(me.start) - 1)})
    received = []
    previous = signal.signal(signal.SIGTERM, lambda *_: received.append(1))
    try:
        with pytest.raises(UserError):
            runs.cancel(rec, Handle("local", "tiny-1a2b3c"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not received
    assert runs.status(rec, Handle("local", "tiny-1a2b3c")).state is State.FAILED


def test_another_hosts_run_is_unknown_here(tmp_path: Path) -> None:
    rec = record(tmp_path)
    rec.update(state="RUNNING", launcher={**dead_process().__dict__, "host": "elsewhere"})
    found = runs.status(rec, Handle("local", "tiny-1a2b3c"))
    assert found.state is State.UNKNOWN and "host elsewhere" in found.detail


def test_an_ended_run_keeps_its_exit_code(tmp_path: Path) -> None:
    rec = record(tmp_path)
    for code, state in ((0, State.SUCCEEDED), (143, State.STOPPED), (1, State.FAILED),
                        (2, State.FAILED)):
        rec.finished(code)
        found = runs.status(rec, Handle("local", "x"))
        assert (found.state, found.exit_code) == (state, code)
    assert "already ended: FAILED (exit code 2)" in runs.cancel(rec, Handle("local", "x"))


def test_follow_ends_with_the_run_and_prints_every_line_once(tmp_path: Path) -> None:
    """Node logs in node order, then the launcher's; a partial last line waits for its end
    (or for the run's); following stops once the run has ended."""
    rec = record(tmp_path)
    rec.launched()
    rec.node_log(1).write_text("[node 1] one\n")
    rec.node_log(0).write_text("[node 0 rank 0 attempt 0] zero\n[node 0] part")
    polls = []

    def sleep(seconds: float) -> None:  # the follower's wait: the run moves on meanwhile
        polls.append(seconds)
        if len(polls) == 1:
            with open(rec.node_log(0), "a") as f:
                f.write("ial\n")
            rec.launcher_log.write_text("torchjob: stopping\n")
        else:
            rec.finished(143)

    lines = list(runs.logs(rec, Handle("local", "x"), follow=True, sleep=sleep))
    assert lines == ["[node 0 rank 0 attempt 0] zero", "[node 1] one", "[node 0] partial",
                     "torchjob: stopping"]
    assert len(polls) == 2


def test_node_lines_keep_the_workers_prefix_and_name_the_agents_node(tmp_path: Path) -> None:
    rec = record(tmp_path)
    out, err = io.BytesIO(), io.BytesIO()
    output = launcher.NodeOutput(rec, out=out, err=err)
    output.line(1, b"[node 0 rank 1 attempt 2] loss 0.1\n")
    output.line(1, b"W1123 agent says\n", stderr=True)
    output.line(1, b"no newline")
    output.close()
    output.line(1, b"after the end\n")  # a straggler: dropped, no error
    assert out.getvalue() == b"[node 0 rank 1 attempt 2] loss 0.1\n[node 1] no newline\n"
    assert err.getvalue() == b"[node 1] W1123 agent says\n"
    assert rec.node_log(1).read_bytes() == (b"[node 0 rank 1 attempt 2] loss 0.1\n"
                                            b"[node 1] W1123 agent says\n"
                                            b"[node 1] no newline\n")


def test_a_stop_before_the_launcher_looks_is_counted_not_fatal(tmp_path: Path) -> None:
    """``torchjob cancel`` may signal the launcher as soon as the record names it, before the
    launcher's body has looked at signals: ``perform`` counts the stop for the body, writes
    the result, and puts the handlers from before back."""
    rec = record(tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    seen: list[launcher.Stops] = []

    def body(stops: launcher.Stops) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # what cancel sends, at the earliest moment
        seen.append(stops)
        return 143

    assert launcher.perform(rec, body) == 143
    assert seen[0].count == 1
    assert (rec.read()["state"], rec.read()["exit_code"]) == ("STOPPED", 143)
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_home_that_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only home (as on some clusters' nodes): a run in the foreground goes on, told
    that only `torchjob logs --log-dir` finds it; a submitted one, which nothing could find,
    is refused with the fix, and leaves no record behind."""
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "afile"))
    found = record(tmp_path, "tiny-000001")
    assert found.read()["state"] == "PENDING"
    said = capsys.readouterr().err
    assert "torchjob: cannot write the index of this machine's runs, " in said, said
    assert f"(torchjob logs finds it with --log-dir {tmp_path / 'runs' / 'tiny'})" in said
    assert runs.find("local", "tiny-000001", str(tmp_path / "runs" / "tiny")).path == found.path
    with pytest.raises(UserError, match="cannot find this run once submitted: set "
                                        "XDG_STATE_HOME to a directory you can write"):
        runs.create("local", "tiny-000002", tmp_path / "runs" / "tiny", name="tiny",
                    request={}, foreground=False)
    assert not (tmp_path / "runs" / "tiny" / ".torchjob" / "tiny-000002").exists()

"""A worker's error file (trainer.error_files): torchjob's workers write it whole or not at all,
and an agent whose worker left one torch cannot read (cut short as the worker was stopped: CI
at stop 50 ended a hang trial with torch's agent dead of json.load's error) sets it aside and
says why the job failed. A node that finds the rendezvous closed says so in a closing line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from jobs.backend import ClosingLines
from tests.procs import PYTHON, env_for_tests, torchjob, wait_for
from torchjob.trainer.contract import CLOSING, CLOSING_RE, closing_line
from torchjob.trainer.error_files import SET_ASIDE, unreadable

GOOD = {"message": {"message": "ValueError: x", "extraInfo": {"timestamp": "1"}}}


@pytest.mark.parametrize("text,why", [
    (json.dumps(GOOD), None), ('{"message": "text", "timestamp": 3}', None),
    ("", "JSONDecodeError"), ('{"message": {"mess', "JSONDecodeError"), ("[1]", "TypeError"),
    ('{"message": {"extraInfo": {}}}', "KeyError"), ('{"message": 3}', "TypeError"),
    ('{"message": "t", "timestamp": "soon"}', "ValueError")])
def test_what_torch_cannot_read_is_told(tmp_path: Path, text: str, why: str | None) -> None:
    (tmp_path / "error.json").write_text(text)
    said = unreadable(str(tmp_path / "error.json"))
    assert (said is None) if why is None else (said or "").startswith(why), said
    assert unreadable(str(tmp_path / "none.json")) is None  # no file: torch reads none
    assert unreadable(str(tmp_path)) is None  # nor a directory


# records one large exception again and again, after saying it began
WRITER = """\
import os, sys
from torchjob.trainer.script import record
exc = ValueError("x" * 2_000_000)
record(exc)
open(sys.argv[1], "w").close()
while True:
    record(exc)
"""


def test_a_worker_killed_as_it_writes_its_error_file_leaves_it_whole(tmp_path: Path) -> None:
    path, began = tmp_path / "error.json", tmp_path / "began"
    for trial in range(5):
        began.unlink(missing_ok=True)
        proc = subprocess.Popen([PYTHON, "-c", WRITER, str(began)], cwd=tmp_path,
                                env=env_for_tests(TORCHELASTIC_ERROR_FILE=str(path)))
        try:
            wait_for(began.exists, 60, "the writer's first record")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        assert unreadable(str(path)) is None, f"trial {trial}: {unreadable(str(path))}"


CUT = """\
import os
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if os.environ["RANK"] == "1":
    open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").close()  # what a stop mid-write left
    os._exit(1)
dist.barrier()
"""


@pytest.mark.integration
def test_an_unreadable_error_file_is_set_aside_and_the_job_says_why_it_failed(
        tmp_path: Path) -> None:
    (tmp_path / "cut.py").write_text(CUT)
    out = torchjob("run", "--nnodes", "1", "--nproc-per-node", "2", "cut.py", cwd=tmp_path,
                   env=env_for_tests(), timeout=150)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]  # the agent's, as json.load failed
    assert "a worker's error file was unreadable (JSONDecodeError" in text, text[-3000:]
    assert f"{CLOSING}node 0 rank 1 exited with code 1: not retried" in text, text[-3000:]
    assert SET_ASIDE in text, text[-3000:]


def test_a_closed_rendezvous_ends_a_node_with_a_line_that_heard_of_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousClosedError

    from torchjob.trainer.agent import ended
    from torchjob.trainer.torchrun_agent import Agent

    Agent.started = 1
    try:
        assert ended(RendezvousClosedError()) == 1
    finally:
        Agent.started = None
    line = capsys.readouterr().err.strip()
    found = CLOSING_RE.match(line)
    assert found and found["heard"] and found["attempt"] == "1", line
    lines = ClosingLines()  # a first-hand line of the same attempt is the job's
    for seen in (line, closing_line("node 0 rank 1 raised ValueError: x", 1, 1)):
        lines.see(f"[node 0] {seen}")
    assert (first := lines.first()) and "ValueError" in first["what"], first

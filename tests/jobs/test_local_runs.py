"""Local runs are jobs (issue 11, part 4): ``torchjob submit --to local`` starts the run
detached and prints ``local:RUN_ID``; ``status``, ``logs``, ``cancel`` and ``list`` find it
from another process, through the per-user index (the README's local-jobs session, run
here); the command lines it started are the rendered request. Real processes over gloo;
every wait is for an event (a state, a file, a line), with a deadline and what was seen.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from torchjob.jobs import backend as registry
from torchjob.jobs import runs
from torchjob.jobs.backend import Context
from torchjob.jobs.backends.local.backend import LocalBackend
from torchjob.jobs.load import load
from tests.procs import ROOT, cmdline, env_for_tests, torchjob
from tests.readme_sessions import run_session, sessions
from tests.recorded import status, submit, wait_until

pytestmark = pytest.mark.integration


def test_the_readme_session_of_local_jobs(tmp_path: Path) -> None:
    """The README's local-jobs session, for real: a short run submitted, followed to its end,
    SUCCEEDED; a long one cancelled right after ``submit`` (at whatever moment of its start
    the signal lands), STOPPED with 143; both listed. Then neither has a process left."""
    run_session(sessions()["local-jobs"], tmp_path)
    records = [json.loads(path.read_text())
               for path in tmp_path.glob(f"runs/*/{runs.RECORD_DIR}/*/{runs.RECORD}")]
    assert sorted(r["name"] for r in records) == ["digits", "digits-long"], records
    procs = [runs.Proc.load(p) for r in records for p in [r["launcher"], *r.get("nodes", [])]]
    wait_until(lambda: not [p for p in procs if p.alive()], 10, "every process to be gone",
               lambda: [p.pid for p in procs if p.alive()])


WORKER = '''
import os, sys, time
sys.stdout.write(f"worker {os.environ['RANK']} up\\n")
sys.stdout.flush()
go = os.path.join(sys.argv[sys.argv.index("--out") + 1], "go")
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
'''


def test_the_command_lines_started_are_the_rendered_request(tmp_path: Path) -> None:
    """While the run waits for a file: each node's process runs exactly the command of the
    record, which is the local backend's render of the same spec and context (what
    ``torchjob render`` and ``run --dry-run`` print); then it ends SUCCEEDED with 0."""
    (tmp_path / "waitworker.py").write_text(WORKER)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: tiny\nnnodes: 2\nnproc_per_node: 1\nmax_restarts: 0\n"
                   f"env: {{PYTHONPATH: {os.pathsep.join([str(tmp_path), str(ROOT)])!r}}}\n"
                   f"trainer: {{module: waitworker, args: {{out: {str(tmp_path)!r}}}}}\n")
    handle = submit("local", job, tmp_path)
    running = status(handle, tmp_path)
    assert running["state"] == "RUNNING", running
    # the job's name means its latest run: the one just submitted
    assert status("local:tiny", tmp_path)["handle"] == running["handle"]
    record = json.loads((Path(running["raw"]["record"]) / "run.json").read_text())
    request = record["request"]
    context = Context(**request["context"])
    assert context.run_id == handle.partition(":")[2]
    rendered = registry.get("local").render(load(job), context)
    assert request["data"] == LocalBackend().record_data(rendered)
    assert request["text"] == rendered.text
    started = [cmdline(int(node["pid"])).split() for node in record["nodes"]]
    assert started == [list(command) for command in rendered.data.commands]
    env = env_for_tests()
    dry = torchjob("run", "--dry-run", str(job), cwd=tmp_path,
                   env=env).stdout  # a fresh id and port
    found = re.search(r"127\.0\.0\.1:(\d+) --rdzv-id (\S+)", dry)
    assert found, dry
    dry_port, dry_id = found.groups()
    assert dry.replace(dry_id, context.run_id).replace(
        f"127.0.0.1:{dry_port}", f"127.0.0.1:{context.port}") == rendered.text, dry

    seen = {"logs": ""}

    def both_workers_logged() -> bool:
        seen["logs"] = torchjob("logs", handle, cwd=tmp_path, env=env).stdout
        return "worker 0 up" in seen["logs"] and "worker 1 up" in seen["logs"]
    wait_until(both_workers_logged, 60, "both workers' lines", lambda: seen["logs"])
    (tmp_path / "go").touch()
    end = wait_until(lambda: (s := status(handle, tmp_path))["state"] != "RUNNING" and s, 60,
                     "the run to end", lambda: status(handle, tmp_path))
    assert (end["state"], end["exit_code"]) == ("SUCCEEDED", 0), end
    lines = torchjob("logs", handle, cwd=tmp_path, env=env).stdout.splitlines()
    assert "[node 0 rank 0 attempt 0] worker 0 up" in lines, lines
    assert "[node 1 rank 1 attempt 0] worker 1 up" in lines, lines


TALKER = '''
import os
for i in range(3):
    print(f"rank {os.environ['RANK']} line {i}", flush=True)
'''


def test_logs_come_in_time_order_by_rank_and_tail(tmp_path: Path) -> None:
    """``torchjob logs``: the launcher's first line first and its last line last, the workers'
    between (the order they came, not node logs then launcher log); ``--rank 1`` only rank 1's
    lines; ``--tail 2`` the last two; a job's name means its latest run."""
    (tmp_path / "talk.py").write_text(TALKER)
    env = env_for_tests()
    ran = torchjob("run", "--nproc-per-node", "2", "--name", "talker", "talk.py", cwd=tmp_path,
                   env=env)
    assert ran.returncode == 0, ran.stderr
    lines = torchjob("logs", "local:talker", cwd=tmp_path, env=env).stdout.splitlines()
    assert lines[0].startswith("torchjob: talker: 1 node(s) x 2 process(es)"), lines
    assert "the job finished" in lines[-1], lines
    assert [line.partition("] ")[2] for line in lines if "] rank 1 line" in line] == \
        [f"rank 1 line {i}" for i in range(3)]
    ranked = torchjob("logs", "local:talker", "--rank", "1", cwd=tmp_path,
                      env=env).stdout.splitlines()
    assert [line.partition("] ")[2] for line in ranked] == [f"rank 1 line {i}" for i in range(3)]
    assert all(line.startswith("[node 0 rank 1 attempt 0] ") for line in ranked), ranked
    tail = torchjob("logs", "local:talker", "--tail", "2", cwd=tmp_path,
                    env=env).stdout.splitlines()
    assert tail == lines[-2:]
    assert torchjob("logs", "local:talker", "--rank", "0", "--tail", "1",
                    cwd=tmp_path, env=env).stdout.splitlines() == [
        next(line for line in reversed(lines) if "rank 0 attempt" in line)]


def test_node_0s_workers_read_the_commands_standard_input(tmp_path: Path) -> None:
    """As under torchrun, whose workers inherit its standard input: a script that reads a
    line from it gets the line, not an end of file."""
    (tmp_path / "ask.py").write_text("import os\nif os.environ['RANK'] == '0':\n"
                                     "    print('read', repr(input()), flush=True)\n")
    proc = torchjob("run", "--nproc-per-node", "2", "ask.py", cwd=tmp_path, input="hello\n",
                    env=env_for_tests())
    assert proc.returncode == 0, proc.stderr
    assert "[node 0 rank 0 attempt 0] read 'hello'" in proc.stdout + proc.stderr, proc

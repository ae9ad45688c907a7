"""Local runs are jobs (issue 11, part 4): ``torchjob submit --to local`` starts the run
detached and prints ``local:RUN_ID``; ``status``, ``logs``, ``cancel`` and ``list`` find it
from another process in another directory, through the per-user index; the command lines it
started are the rendered request. Real processes over gloo; every wait is for an event
(a state, a step in metrics.jsonl, a file), with a deadline and what was seen.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from jobs import backend as registry
from jobs.backend import Context
from jobs.backends.local.backend import plan_data
from jobs.load import load
from tests.procs import ROOT, alive, cmdline, descendants, last_step
from tests.recorded import follow, status, submit, torchjob, wait_until
from trainer.contract import parse_log_prefix

pytestmark = pytest.mark.integration
DEFAULT = ROOT / "jobs" / "examples" / "default.yaml"


def test_a_submitted_run_is_followed_and_cancelled_from_another_terminal(
        tmp_path: Path) -> None:
    """2 nodes x 1 process of the default job: RUNNING, listed, its logs carry node, rank
    and attempt; ``cancel`` from another process in another directory: the workers
    checkpoint, the run ends STOPPED with 143, and none of its processes is left."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    handle = submit("local", DEFAULT, here, "nnodes=2", "nproc_per_node=1",
                    "trainer.args.epochs=50", "trainer.args.log_every=1",
                    "trainer.args.progress=lines")
    first = status(handle, elsewhere)
    assert first["state"] == "RUNNING" and first["handle"] == handle, first
    run_dir = Path(first["raw"]["run_dir"])
    assert run_dir == here / "runs" / "digits"

    def logs() -> str:
        return torchjob("logs", handle, cwd=elsewhere).stdout

    wait_until(lambda: last_step(run_dir) >= 2, 180, "step 2 in metrics.jsonl",
               lambda: (status(handle, elsewhere)["state"], logs()[-3000:]))
    listed = json.loads(torchjob("list", "--to", "local", "--json", cwd=elsewhere).stdout)
    assert {"handle": handle, "state": "RUNNING"}.items() <= \
        next(s for s in listed if s["handle"] == handle).items(), listed
    nodes = [int(n["pid"]) for n in status(handle, elsewhere)["raw"]["nodes"]]
    family = {pid for node in nodes for pid in [node, *descendants(node)]}
    assert len(family) >= 4, family  # two agents, their workers

    follower = follow(handle, elsewhere)
    cancelled = torchjob("cancel", handle, cwd=elsewhere)
    assert cancelled.returncode == 0 and "SIGTERM sent" in cancelled.stdout, cancelled
    try:
        followed, err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    end = status(handle, elsewhere)
    assert (end["state"], end["exit_code"]) == ("STOPPED", 143), (end, followed[-3000:])
    prefixed = [parse_log_prefix(line) for line in followed.splitlines()]
    assert {(node, rank, attempt) for node, rank, attempt, _ in filter(None, prefixed)} == \
        {(0, 0, 0), (1, 1, 0)}, followed[-3000:]
    assert all(line.startswith(("[node 0", "[node 1", "torchjob: "))
               for line in followed.splitlines()), followed[-3000:]
    assert followed.count("stopped by SIGTERM after step") == 2, followed[-3000:]
    assert "torchjob: stopping: SIGTERM to 2 node(s)" in followed
    assert sorted((run_dir / "checkpoints").glob("step_*")), "no checkpoint"
    wait_until(lambda: not [p for p in family if alive(p)], 10, "every process to be gone",
               lambda: [p for p in family if alive(p)])
    again = torchjob("cancel", handle, cwd=elsewhere)
    assert "has already ended: STOPPED (exit code 143)" in again.stdout, again


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
    record = json.loads((Path(running["raw"]["record"]) / "run.json").read_text())
    request = record["request"]
    context = Context(**request["context"])
    assert context.run_id == handle.partition(":")[2]
    rendered = registry.get("local").render(load(job), context)
    assert request["data"] == plan_data(rendered.data)
    assert request["text"] == rendered.text
    started = [cmdline(int(node["pid"])).split() for node in record["nodes"]]
    assert started == [list(command) for command in rendered.data.commands]
    dry = torchjob("run", "--dry-run", str(job), cwd=tmp_path).stdout  # a fresh id and port
    found = re.search(r"127\.0\.0\.1:(\d+) --rdzv-id (\S+)", dry)
    assert found, dry
    dry_port, dry_id = found.groups()
    assert dry.replace(dry_id, context.run_id).replace(
        f"127.0.0.1:{dry_port}", f"127.0.0.1:{context.port}") == rendered.text, dry

    seen = {"logs": ""}

    def both_workers_logged() -> bool:
        seen["logs"] = torchjob("logs", handle, cwd=tmp_path).stdout
        return "worker 0 up" in seen["logs"] and "worker 1 up" in seen["logs"]
    wait_until(both_workers_logged, 60, "both workers' lines", lambda: seen["logs"])
    (tmp_path / "go").touch()
    end = wait_until(lambda: (s := status(handle, tmp_path))["state"] != "RUNNING" and s, 60,
                     "the run to end", lambda: status(handle, tmp_path))
    assert (end["state"], end["exit_code"]) == ("SUCCEEDED", 0), end
    lines = torchjob("logs", handle, cwd=tmp_path).stdout.splitlines()
    assert "[node 0 rank 0 attempt 0] worker 0 up" in lines, lines
    assert "[node 1 rank 1 attempt 0] worker 1 up" in lines, lines

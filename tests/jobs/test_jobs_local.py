"""The local renderer: whole-output golden files, plan shape, and quoting of hostile strings.

Golden files live in tests/jobs/golden/. After an intended change to the rendered output,
regenerate them with one flag and review the diff:

    TORCHJOB_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/jobs/test_jobs_local.py
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchjob.jobs.load import load, loads
from torchjob.jobs.backends.local.render import LocalPlan, render_local, render_text
from torchjob.trainer.contract import omp_threads
from tests.golden import assert_golden

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "jobs" / "examples"
FIXED: dict[str, Any] = dict(port=29500, python="/usr/bin/python3", run_id="fixed-run-id",
                             cpu_count=8)
HOSTILE = ["a'; touch {marker}", 'b"; touch {marker}; "', "$(touch {marker})", "`touch {marker}`",
           "two words", "new\nline", "tab\there", "caf\u00e9 \u65e5\u672c \U0001f600", "", "--x",
           "semi;colon", "*", "~", "back\\slash", "!event", "${HOME}"]


@pytest.mark.parametrize("example", ["default", "elastic"])
def test_golden(example: str) -> None:
    text = render_text(render_local(load(EXAMPLES / f"{example}.yaml"), **FIXED))
    assert_golden(text, HERE / "golden" / f"{example}.sh")


def test_plan_shape() -> None:
    spec = loads("name: job\nnnodes: 1:3\nnproc_per_node: 2\nmax_restarts: 1\nlocal: {nodes: 2}\n"
                 "rdzv: {join_timeout: 30, last_call_timeout: 2}\nenv: {A: b}\n"
                 "secrets: [{env: TOKEN, secret: s, key: k}]\n"
                 "trainer: {args: {epochs: 2, resume: false}}")
    plan = render_local(spec, port=1234, python="py", run_id="rid", cpu_count=16)
    assert len(plan.commands) == 2 and plan.commands[0] == plan.commands[1]
    assert list(plan.commands[0]) == [
        "py", "-m", "torchjob.trainer.agent", "--run-dir", "runs/job", "--checkpoint-dir",
        "runs/job/checkpoints", "--hang-timeout", "180", "--nnodes", "1:3",
        "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1234", "--rdzv-id", "rid",
        "--rdzv-conf", "join_timeout=30,last_call_timeout=2,is_host=false", "--max-restarts", "1",
        "--monitor-interval", "0.1", "-m", "torchjob.trainer", "--run-dir", "runs/job",
        "--checkpoint-dir", "runs/job/checkpoints", "--epochs", "2", "--resume", "false"]
    assert dict(plan.env) == {"OMP_NUM_THREADS": "4", "PYTHONUNBUFFERED": "1", "A": "b"}
    assert plan.secrets == ("TOKEN",) and "TOKEN" not in plan.env
    assert render_text(plan).startswith("# secrets read from your environment: TOKEN\n")
    assert plan == render_local(spec, port=1234, python="py", run_id="rid", cpu_count=16)
    # elastic: the rendezvous store is a process of its own, started first, stopped last
    assert plan.store == ("py", "-m", "torchjob.trainer.store", "--port", "1234")
    assert render_text(plan).splitlines()[-1] == "wait %2 %3; kill %1"
    fixed = render_local(loads("name: job\nnnodes: 2"), **FIXED)
    assert fixed.store is None and "is_host" not in " ".join(fixed.commands[0])


def test_omp_threads_and_user_override() -> None:
    assert omp_threads(2, 2) == 1 and omp_threads(0.5, 4) == 1 and omp_threads(32, 4) == 8
    assert omp_threads(None, 2) == 1 and omp_threads(3.5, 1) == 3
    spec = loads("name: job\nenv: {OMP_NUM_THREADS: 3}")
    assert render_local(spec, **FIXED).env["OMP_NUM_THREADS"] == "3"


def _hostile_plan(marker: Path, python: str, nodes: int = 1) -> LocalPlan:
    values = [h.replace("{marker}", str(marker)) for h in HOSTILE]
    quoted = [json.dumps(v, ensure_ascii=False) for v in values]  # YAML double-quoted scalars
    spec = loads(f"name: job\nnnodes: {nodes}\ntrainer: {{module: tool}}\n",
                 [f"env.V{i}={q}" for i, q in enumerate(quoted)]
                 + [f"trainer.args.a{i}={q}" for i, q in enumerate(quoted)])
    assert [spec.env[f"V{i}"] for i in range(len(values))] == values
    return render_local(spec, port=1, python=python, run_id="r", cpu_count=1)


def test_hostile_strings_round_trip_through_shlex(tmp_path: Path) -> None:
    plan = _hostile_plan(tmp_path / "pwned", "python3")
    words = shlex.split(render_text(plan))
    assert words == [f"{k}={v}" for k, v in plan.env.items()] + list(plan.commands[0])


def test_trainer_args_with_hostile_task_are_quoted(tmp_path: Path) -> None:
    spec = loads(f"name: job\ntrainer: {{args: {{task: \"x'; touch {tmp_path}/p #:f\"}}}}")
    plan = render_local(spec, **FIXED)
    assert shlex.split(render_text(plan))[-1] == f"x'; touch {tmp_path}/p #:f"


@pytest.mark.parametrize("nodes", [1, 2])
def test_hostile_strings_survive_bash(tmp_path: Path, nodes: int) -> None:
    """Run the rendered text with bash, with a stand-in 'python' that records what it got."""
    marker = tmp_path / "pwned"
    show = tmp_path / "show"
    show.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"out = {str(tmp_path)!r} + f'/seen-{{os.getpid()}}.json'\n"
                    "keep = ('OMP_NUM_THREADS', 'PYTHONUNBUFFERED')\n"
                    "env = {k: v for k, v in os.environ.items() if k[:1] == 'V' or k in keep}\n"
                    "json.dump({'argv': sys.argv[1:], 'env': env}, open(out, 'w'))\n")
    show.chmod(0o755)
    plan = _hostile_plan(marker, str(show), nodes)
    subprocess.run(["bash", "-c", render_text(plan)], check=True, cwd=tmp_path, timeout=60,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    seen = [json.loads(p.read_text()) for p in tmp_path.glob("seen-*.json")]
    assert len(seen) == nodes
    for record in seen:
        assert record["argv"] == list(plan.commands[0][1:])
        assert record["env"] == dict(plan.env)
    assert not marker.exists()

"""No process of a real ``torchjob run`` forks after it has queried CUDA (tests/cuda_forks.py):
on a GPU the forked workers would fail at their first CUDA call. Every path a job can take:
the built-in trainer (workers forked from the agent's fork server), a module and a script (run
as torchrun runs them). Needs no GPU: the calls are recorded, not their results."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import cuda_forks
from tests.procs import ROOT, env_for_tests, torchjob

pytestmark = pytest.mark.integration

JOBS = {
    "trainer": [str(ROOT / "jobs/examples/default.yaml"), "--set", "trainer.args.epochs=1"],
    "module": [str(ROOT / "jobs/examples/script.yaml"), "--set", "trainer.script=",
               "--set", "trainer.module=torchjob.jobs.examples.ddp_script",
               "--set", "trainer.args.steps=5"],
    "script": [str(ROOT / "jobs/examples/script.yaml"), "--set", "trainer.args.steps=5"],
    # torchrun's word, counted by each agent (trainer.gpus.nproc_per_node): here one CPU
    "trainer-auto": [str(ROOT / "jobs/examples/default.yaml"), "--set", "trainer.args.epochs=1",
                     "--set", "nproc_per_node=auto"],
}


@pytest.mark.parametrize("path", sorted(JOBS))
def test_no_process_forks_after_querying_cuda(tmp_path: Path, path: str) -> None:
    record = tmp_path / "record"
    # one process: on a machine with one GPU (where this test means most) two are refused;
    # "auto" counts the GPU there, else the CPUs the agent may use: one, as this test runs it
    nproc = [] if path.endswith("-auto") else ["--set", "nproc_per_node=1"]
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # the job's processes inherit it
    try:
        proc = torchjob("run", *JOBS[path], *nproc, "--set", f"run_dir={tmp_path / 'run'}",
                        env=env_for_tests(**cuda_forks.recording_env(record)), timeout=300)
    finally:
        os.sched_setaffinity(0, cpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world size 1;" in proc.stderr + proc.stdout, proc.stderr[-3000:]
    records = cuda_forks.read(record)
    queried = {r["pid"] for r in records if r["event"] == "cuda"}
    # the recorder saw the run: the agent's and the worker's CUDA queries
    assert len(queried) >= 2, f"no CUDA queries recorded in {len(records)} records"
    if path.startswith("trainer"):  # the fork server, the resource tracker, its worker
        assert sum(r["event"] == "fork" for r in records) >= 3, records
    cuda_forks.assert_no_fork_after_cuda(records)

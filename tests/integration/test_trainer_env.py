"""The real trainer, two processes, started the way each launcher starts it (no torchrun):
every source of the environment contract gives the right place in the world."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests, free_port
from torchjob.trainer.env import slurm_port

pytestmark = pytest.mark.integration
QUICK = ["--max-steps", "3", "--eval-every", "0", "--checkpoint-every", "0",
         "--progress", "lines"]
JOINED = re.compile(r"joined: rank (\d+) local_rank (\d+) world_size (\d+) master (\S+):(\d+) "
                    r"from (\S+);")


def free_slurm_job_id() -> tuple[int, int]:
    """A job id whose derived port is free right now."""
    for job_id in range(4242, 4242 + 2000):
        port = slurm_port(job_id)
        try:
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
            return job_id, port
        except OSError:
            continue
    raise AssertionError("no free port in the Slurm range")


def launch(tmp_path: Path, per_rank_env: list[dict[str, str]]) -> list[tuple[str, ...]]:
    procs = [subprocess.Popen([PYTHON, "-m", "torchjob.trainer", "--run-dir", str(tmp_path / "run"),
                               *QUICK], env=env_for_tests(**extra), stderr=subprocess.PIPE,
                              text=True) for extra in per_rank_env]
    lines = []
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        lines += JOINED.findall(err)
    return sorted(lines)


def test_srun_without_torchrun(tmp_path: Path) -> None:
    job_id, port = free_slurm_job_id()
    common = {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2",
              "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "0",
              "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2",
              "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_NODELIST": "localhost"}
    got = launch(tmp_path, [{**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}
                            for r in range(2)])
    assert got == [(str(r), str(r), "2", "localhost", str(port), "slurm") for r in range(2)]


def test_open_mpi(tmp_path: Path) -> None:
    port = free_port()
    got = launch(tmp_path, [{"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
                             "OMPI_COMM_WORLD_LOCAL_RANK": str(r),
                             "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": str(port)} for r in range(2)])
    assert got == [(str(r), str(r), "2", "127.0.0.1", str(port), "mpi") for r in range(2)]


def test_pytorchjob_pod_one_process_per_pod(tmp_path: Path) -> None:
    port = free_port()
    got = launch(tmp_path, [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "localhost",
                             "MASTER_PORT": str(port), "PET_NPROC_PER_NODE": "1",
                             "PET_NNODES": "2", "PET_NODE_RANK": str(r),
                             "PYTHONUNBUFFERED": "1"} for r in range(2)])
    assert got == [(str(r), "0", "2", "localhost", str(port), "k8s-pod") for r in range(2)]


def test_torchrun(tmp_path: Path) -> None:
    proc = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "torchjob.trainer", "--run-dir",
                           str(tmp_path / "run"), *QUICK], env=env_for_tests(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = sorted(JOINED.findall(proc.stderr))
    assert [g[:3] for g in got] == [("0", "0", "2"), ("1", "1", "2")]
    assert {g[5] for g in got} == {"torchrun"}


def test_single_process(tmp_path: Path) -> None:
    got = launch(tmp_path, [{}])
    assert got == [("0", "0", "1", "127.0.0.1", "29500", "single")]


@pytest.mark.parametrize("env, names", [
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
      "MASTER_ADDR": "x", "MASTER_PORT": "1"}, ["RANK", "WORLD_SIZE"]),
    ({"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "pj-master-0", "MASTER_PORT": "23456",
      "PET_NPROC_PER_NODE": "2"}, ["PET_NPROC_PER_NODE", "torchrun"]),
    ({"PET_NNODES": "2", "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_NPROC_PER_NODE": "2"},
     ["PET_NNODES", "torchrun"]),
    ({"LOCAL_RANK": "0"}, ["RANK"]),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, ["srun"]),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, ["MASTER_ADDR"]),
])
def test_contradictions_exit_2_with_the_variables_named(tmp_path: Path, env: dict[str, str],
                                                        names: list[str]) -> None:
    proc = subprocess.run([PYTHON, "-m", "torchjob.trainer", "--run-dir", str(tmp_path), *QUICK],
                          env=env_for_tests(**env), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for name in names:
        assert name in proc.stderr, proc.stderr

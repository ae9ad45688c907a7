"""The development Slurm cluster is real: two slurmd nodes, srun, sbatch, accounting, torch."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.procs import PYTHON, ROOT, env_for_tests, free_port, wait_for

if TYPE_CHECKING:
    from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

# The pid files slurm/devcluster's daemons write.
PID_FILES = {
    "munged": "/run/munge/munged.pid",
    "mariadb": "/run/mysqld/mysqld.pid",
    "slurmdbd": "/run/slurmdbd.pid",
    "slurmctld": "/run/slurmctld.pid",
    "slurmd n1": "/run/slurmd-n1.pid",
    "slurmd n2": "/run/slurmd-n2.pid",
}


def run(cmd: list[str], *, timeout: float = 120, cwd: Path | None = None,
        **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL, env=env_for_tests(**env), check=False)


def devcluster(cluster: SlurmCluster, command: str) -> subprocess.CompletedProcess[str]:
    return run(["bash", str(cluster.script), command])


def node_states(partition: str) -> dict[str, str]:
    out = run(["sinfo", "-N", "-h", "-p", partition, "-o", "%N %P %t"]).stdout
    return {node: f"{part} {state}" for node, part, state in
            (line.split() for line in out.splitlines() if line.strip())}


def test_sinfo_shows_both_nodes_idle_in_debug(slurm_cluster: SlurmCluster) -> None:
    want = {n: "debug* idle" for n in slurm_cluster.nodes}  # `*`: the default partition
    deadline = time.monotonic() + 60  # another test run may briefly hold the nodes
    while (states := node_states(slurm_cluster.partition)) != want \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert states == want


def test_srun_runs_two_tasks_on_each_node(slurm_cluster: SlurmCluster) -> None:
    proc = run(["srun", "-N2", "-n4", "-t", "5", "bash", "-c",
                "echo $SLURM_NODEID $SLURM_PROCID $SLURMD_NODENAME"])
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert sorted(int(procid) for _, procid, _ in rows) == [0, 1, 2, 3]
    assert Counter(nodeid for nodeid, _, _ in rows) == {"0": 2, "1": 2}
    assert Counter(name for _, _, name in rows) == {"n1": 2, "n2": 2}


def test_sbatch_wait_completes_and_sacct_records_it(
        slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = run(["sbatch", "--wait", "--parsable", "-N1", "-n1", "-t", "5",
                "-o", str(tmp_path / "job-%j.out"),
                "--wrap", "echo hello from $SLURMD_NODENAME"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), proc.stdout
    assert re.fullmatch(r"hello from n[12]\n",
                        (tmp_path / f"job-{job_id}.out").read_text())
    # slurmctld hands the record to slurmdbd asynchronously: poll briefly.
    deadline = time.monotonic() + 30
    while True:
        sacct = run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"])
        if sacct.stdout.strip() == "COMPLETED" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sacct.stdout.strip() == "COMPLETED", sacct.stdout + sacct.stderr


def read_pids() -> dict[str, int]:
    pids = {name: int(Path(path).read_text().split()[0]) for name, path in PID_FILES.items()}
    for name, pid in pids.items():
        assert Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) is not running"
    return pids


def test_up_again_is_fast_and_restarts_nothing(slurm_cluster: SlurmCluster) -> None:
    before = read_pids()
    start = time.monotonic()
    proc = devcluster(slurm_cluster, "up")
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already up and healthy" in proc.stdout, proc.stdout
    assert took < 2.0, f"up on a healthy cluster took {took:.2f} s"
    assert read_pids() == before


def test_status_is_healthy(slurm_cluster: SlurmCluster) -> None:
    proc = devcluster(slurm_cluster, "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in PID_FILES:
        assert re.search(rf"^\s+{name}\s+up\b", proc.stdout, re.M), proc.stdout
    assert "status: healthy" in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the script as another user")
def test_up_as_non_root_says_it_cannot_run_here() -> None:
    proc = subprocess.run(["runuser", "-u", "nobody", "--", "bash", "-s", "up"],
                          input=(ROOT / "slurm" / "devcluster").read_text(),
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot run here: must run as root" in proc.stderr


ALLREDUCE = """
import os
import torch
import torch.distributed as dist

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", rank=rank, world_size=world)  # MASTER_ADDR/PORT from env
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(os.environ["SLURMD_NODENAME"], rank, world, int(t.item()), flush=True)
dist.destroy_process_group()
"""


def test_torch_gloo_allreduce_across_both_nodes(slurm_cluster: SlurmCluster) -> None:
    proc = run(["srun", "-N2", "-n4", "-t", "5", "--kill-on-bad-exit=1",
                PYTHON, "-c", ALLREDUCE],
               timeout=180, MASTER_ADDR="n1", MASTER_PORT=str(free_port()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert sorted(int(rank) for _, rank, _, _ in rows) == [0, 1, 2, 3]
    assert Counter(node for node, _, _, _ in rows) == {"n1": 2, "n2": 2}
    assert {(world, total) for _, _, world, total in rows} == {("4", "10")}  # 1+2+3+4


def test_up_after_a_host_restart_cancels_jobs_whose_processes_are_gone(
        slurm_cluster: SlurmCluster) -> None:
    """A host restart kills the daemons and every job on it; slurmctld's saved state still says
    the job runs. `up` cancels it, so the nodes are free at once rather than held for minutes
    and the old job is not requeued to run again."""
    sleep = f"sleep 600.{os.getpid()}"  # a command line no other process has
    proc = run(["sbatch", "--parsable", "-N2", "-n2", "-t", "10", "-o", "/dev/null",
                "--wrap", f"exec {sleep}"])
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: subprocess.run(["pgrep", "-f", f"^{sleep}$"],
                                        check=False).returncode == 0,
                 timeout=60, what=f"job {job} to start")
        assert devcluster(slurm_cluster, "down").returncode == 0
        # What the restart does to the job: its slurmstepd and its processes die with the host.
        subprocess.run(["pkill", "-KILL", "-f", rf"^slurmstepd: \[{job}\."], check=False)
        subprocess.run(["pkill", "-KILL", "-f", f"^{sleep}$"], check=False)
        up = devcluster(slurm_cluster, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"jobs: cancelling {job}: running before slurmctld started" in up.stdout, \
            up.stdout
        want = {n: "debug* idle" for n in slurm_cluster.nodes}
        wait_for(lambda: node_states(slurm_cluster.partition) == want, timeout=30,
                 what="both nodes idle after up")
        state = run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"]).stdout.split()
        assert state and state[0].startswith("CANCELLED"), state
    finally:
        run(["scancel", job])

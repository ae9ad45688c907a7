"""DistEnv.from_environ against the environments real launchers set, and every contradiction."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchjob.trainer.env import (DistEnv, EnvError, expand_hostlist, first_host,
                                  parse_tasks_per_node, slurm_port)

REPO = Path(__file__).resolve().parents[2]

# What torchrun 2.x sets per worker (captured from `torchrun --standalone --nproc-per-node 2`).
TORCHRUN_STANDALONE_RANK1 = {
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "localhost", "MASTER_PORT": "32963", "RANK": "1", "ROLE_RANK": "1",
    "ROLE_WORLD_SIZE": "2", "ROLE_NAME": "default", "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_RUN_ID": "970cf0f6-f221-45ab-aaa3-125ed0769641", "WORLD_SIZE": "2",
    "TORCHELASTIC_ERROR_FILE": "/tmp/torchelastic_x/attempt_0/1/error.json",
}

# The PyTorchJob operator's pod-level variables: Worker 0 (pod index 1) of a Master + 2 Workers.
PYTORCHJOB_POD1 = {
    "PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "1", "PET_NNODES": "3",
    "MASTER_ADDR": "digits-master-0", "MASTER_PORT": "23456",
    "PET_MASTER_ADDR": "digits-master-0", "PET_MASTER_PORT": "23456",
    "RANK": "1", "PET_NODE_RANK": "1", "WORLD_SIZE": "3",
}

# torchrun inside the second pod (Worker 0) of a PyTorchJob with nprocPerNode "2": torchrun's
# per-process values replace RANK/WORLD_SIZE; PET_* stay, as does PET_NPROC_PER_NODE=2.
TORCHRUN_IN_PYTORCHJOB = {
    **PYTORCHJOB_POD1, "PET_NPROC_PER_NODE": "2", "PET_NNODES": "2", "WORLD_SIZE": "4",
    "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
    "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
    "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True",
}

# TorchX dist.ddp -j 2x2 on Kubernetes: torchrun --rdzv_backend c10d
# --rdzv_endpoint $TORCHX_RANK0_HOST:29500 --rdzv_id <app id>; this is node 1, local rank 0.
TORCHX_DDP = {
    "LOGLEVEL": "WARNING", "TORCHX_TRACKING_EXPERIMENT_NAME": "default-experiment",
    "TORCHX_RANK0_HOST": "trainer-x1y2-0", "TORCHX_JOB_ID": "kubernetes://torchx/trainer-x1y2",
    "TORCHX_REPLICA_ID": "1", "TORCHX_ROLE_NAME": "trainer",
    "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "2", "ROLE_WORLD_SIZE": "4",
    "MASTER_ADDR": "trainer-x1y2-0", "MASTER_PORT": "41211",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_RUN_ID": "trainer-x1y2",
}

# `sbatch --nodes 2 --ntasks-per-node 2` then `srun python -m torchjob.trainer`: task 3 (node 1,
# local 1).
SRUN_2X2_TASK3 = {
    "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_JOB_NODELIST": "gpu-[03-04]",
    "SLURM_NODELIST": "gpu-[03-04]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
    "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_NTASKS_PER_NODE": "2", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "gpu-[03-04]", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_GTIDS": "2,3", "SLURM_CPUS_ON_NODE": "8",
    "SLURM_TASK_PID": "12345", "SLURMD_NODENAME": "gpu-04",
}

# The sbatch batch script itself (no srun step): Slurm sets PROCID/LOCALID/NODEID 0 here too.
SBATCH_SCRIPT = {key: value for key, value in SRUN_2X2_TASK3.items()
                 if not key.startswith("SLURM_STEP")} | {
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_GTIDS": "0"}

# `mpirun -np 4 --map-by ppr:2:node -x MASTER_ADDR -x MASTER_PORT python -m torchjob.trainer`,
# rank 2.
OPENMPI_RANK2 = {
    "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "0", "OMPI_UNIVERSE_SIZE": "4", "PMIX_RANK": "2",
    "PMIX_NAMESPACE": "prterun-host-1234@1", "MASTER_ADDR": "node1", "MASTER_PORT": "29400",
}

# MPICH / Intel MPI `mpiexec -n 2 -genv MASTER_ADDR node1 -genv MASTER_PORT 29400`, rank 1.
MPICH_RANK1 = {
    "PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "6", "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "29400",
}


def fields(env: DistEnv) -> tuple[int, int, int, int, int, str, int, str]:
    return (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank,
            env.master_addr, env.master_port, env.source)


@pytest.mark.parametrize("environ, expected", [
    (TORCHRUN_STANDALONE_RANK1, (1, 1, 2, 2, 0, "localhost", 32963, "torchrun")),
    (TORCHRUN_IN_PYTORCHJOB, (3, 1, 4, 2, 1, "digits-master-0", 23456, "torchrun")),
    (TORCHX_DDP, (2, 0, 4, 2, 1, "trainer-x1y2-0", 41211, "torchrun")),
    (PYTORCHJOB_POD1, (1, 0, 3, 1, 1, "digits-master-0", 23456, "k8s-pod")),
    ({**PYTORCHJOB_POD1, "PET_NPROC_PER_NODE": "auto"},
     (1, 0, 3, 1, 1, "digits-master-0", 23456, "k8s-pod")),
    (SRUN_2X2_TASK3, (3, 1, 4, 2, 1, "gpu-03", slurm_port(4242), "slurm")),
    (OPENMPI_RANK2, (2, 0, 4, 2, 0, "node1", 29400, "mpi")),
    (MPICH_RANK1, (1, 1, 2, 2, 0, "node1", 29400, "mpi")),
    ({}, (0, 0, 1, 1, 0, "127.0.0.1", 29500, "single")),
    ({"PATH": "/usr/bin", "HOME": "/root", "MASTER_PORT": ""},
     (0, 0, 1, 1, 0, "127.0.0.1", 29500, "single")),
    ({"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29411"},
     (0, 0, 1, 1, 0, "10.0.0.5", 29411, "single")),
], ids=["torchrun-standalone", "torchrun-in-pytorchjob", "torchx-dist-ddp", "pytorchjob-pod",
        "pytorchjob-pod-auto", "srun-2x2", "openmpi", "mpich", "empty", "unrelated", "single-port"])
def test_each_source(environ: dict[str, str], expected: tuple[object, ...]) -> None:
    assert fields(DistEnv.from_environ(environ)) == expected


def test_torchrun_restart_and_run_id() -> None:
    env = DistEnv.from_environ(TORCHRUN_IN_PYTORCHJOB)
    assert (env.restart_count, env.run_id, env.is_distributed, env.is_main) == (2, "none", True,
                                                                                False)
    assert DistEnv.from_environ(TORCHX_DDP).run_id == "trainer-x1y2"


def test_slurm_details() -> None:
    env = DistEnv.from_environ(SRUN_2X2_TASK3)
    assert (env.run_id, env.restart_count, env.master_port) == ("4242", 0, 12000 + 4242)
    override = DistEnv.from_environ({**SRUN_2X2_TASK3, "MASTER_ADDR": "gpu-03-ib",
                                     "MASTER_PORT": "29999"})
    assert (override.master_addr, override.master_port) == ("gpu-03-ib", 29999)
    # the step's values win over the allocation's (srun -n 3 inside a 4-task allocation)
    step = DistEnv.from_environ({**SRUN_2X2_TASK3, "SLURM_STEP_NUM_TASKS": "3",
                                 "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_PROCID": "2",
                                 "SLURM_LOCALID": "0"})
    assert (step.world_size, step.local_world_size, step.node_rank) == (3, 1, 1)
    # uneven nodes: 3 nodes with 2 tasks and 1 with 1; the last node holds rank 6 alone
    uneven = DistEnv.from_environ({**SRUN_2X2_TASK3, "SLURM_STEP_NUM_TASKS": "7",
                                   "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_PROCID": "6",
                                   "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
                                   "SLURM_STEP_NODELIST": "n[1-3],m7"})
    assert fields(uneven) == (6, 0, 7, 1, 3, "n1", slurm_port(4242), "slurm")
    # one-task batch script: nothing to coordinate, so it is a single process
    one = {**SBATCH_SCRIPT, "SLURM_NTASKS": "1", "SLURM_NPROCS": "1", "SLURM_TASKS_PER_NODE": "1"}
    assert DistEnv.from_environ(one).source == "single"


def test_mpirun_inside_slurm_allocation() -> None:
    # mpirun started its daemons with srun: the SLURM_* step values describe the daemon step
    # (one task per node), not this process; Open MPI's values win.
    daemon_step = {**SRUN_2X2_TASK3, "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE":
                   "1(x2)", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "1"}
    env = DistEnv.from_environ({**daemon_step, **OPENMPI_RANK2})
    assert fields(env) == (2, 0, 4, 2, 0, "node1", 29400, "mpi")
    # srun --mpi=pmi2 sets PMI_* equal to SLURM_*: then Slurm's fuller picture is used.
    pmi2 = {**SRUN_2X2_TASK3, "PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "7"}
    assert DistEnv.from_environ(pmi2).source == "slurm"


def test_export_round_trips_through_torchrun_variables() -> None:
    env = DistEnv.from_environ(SRUN_2X2_TASK3)
    exported = env.export()
    assert exported == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu-03",
                        "MASTER_PORT": str(slurm_port(4242))}
    again = DistEnv.from_environ(exported)
    assert (again.rank, again.local_rank, again.world_size, again.local_world_size,
            again.master_addr, again.master_port) == (3, 1, 4, 2, "gpu-03", slurm_port(4242))


def test_from_environ_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "PET_", "TORCHELASTIC_")) or name in {
                "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"}:
            monkeypatch.delenv(name)
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29401")
    assert fields(DistEnv.from_environ()) == (0, 0, 1, 1, 0, "10.1.2.3", 29401, "single")


T = TORCHRUN_STANDALONE_RANK1
NO_RANK = {k: v for k, v in T.items() if k != "RANK"}


@pytest.mark.parametrize("environ, names", [
    ({**T, "RANK": "2"}, ["RANK=2", "WORLD_SIZE=2"]),
    ({**T, "LOCAL_RANK": "2"}, ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]),
    ({**T, "LOCAL_WORLD_SIZE": "3"}, ["LOCAL_WORLD_SIZE=3", "WORLD_SIZE=2"]),
    ({**T, "RANK": "abc"}, ["RANK='abc'", "whole number"]),
    ({**T, "RANK": "-1"}, ["RANK=-1", ">= 0"]),
    ({**T, "WORLD_SIZE": "0"}, ["WORLD_SIZE=0", ">= 1"]),
    ({**T, "WORLD_SIZE": "2.0"}, ["WORLD_SIZE='2.0'"]),
    (NO_RANK, ["RANK is not set", "LOCAL_RANK=1", "torchrun"]),
    ({k: v for k, v in T.items() if k != "LOCAL_WORLD_SIZE"}, ["LOCAL_WORLD_SIZE is not set"]),
    ({"RANK": "0"}, ["RANK=0", "WORLD_SIZE is not"]),
    ({"WORLD_SIZE": "2"}, ["WORLD_SIZE=2", "RANK is not"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
     ["LOCAL_WORLD_SIZE=2", "LOCAL_RANK"]),
    ({k: v for k, v in T.items() if k != "MASTER_ADDR"}, ["MASTER_ADDR=<unset>", "MASTER_PORT"]),
    ({k: v for k, v in T.items() if k != "MASTER_PORT"}, ["MASTER_PORT=<unset>", "WORLD_SIZE=2"]),
    ({**T, "MASTER_PORT": "70000"}, ["MASTER_PORT=70000", "65535"]),
    ({**T, "MASTER_PORT": "0"}, ["MASTER_PORT=0", "65535"]),
    ({"MASTER_PORT": "http"}, ["MASTER_PORT='http'"]),
    ({**T, "TORCHELASTIC_RESTART_COUNT": "x"}, ["TORCHELASTIC_RESTART_COUNT='x'"]),
], ids=lambda v: "" if isinstance(v, dict) else v[0])
def test_torch_variable_contradictions(environ: dict[str, str], names: list[str]) -> None:
    with pytest.raises(EnvError) as info:
        DistEnv.from_environ(environ)
    for name in names:
        assert name in str(info.value)


def test_pod_level_rank_with_several_processes_per_pod() -> None:
    with pytest.raises(EnvError) as info:
        DistEnv.from_environ({**PYTORCHJOB_POD1, "PET_NPROC_PER_NODE": "2", "WORLD_SIZE": "6"})
    message = str(info.value)
    for part in ("RANK=1", "WORLD_SIZE=6", "per pod", "PET_NPROC_PER_NODE=2", "LOCAL_RANK",
                 "torchrun -m torchjob.trainer"):
        assert part in message


@pytest.mark.parametrize("environ", [
    # TrainJob torch plugin: five PET_* only; the controller starts no torchrun
    {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
     "PET_MASTER_ADDR": "digits-node-0-0.digits", "PET_MASTER_PORT": "29500"},
    # elastic PyTorchJob (Workers only): rendezvous endpoint, no MASTER_*/RANK
    {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "1:4",
     "PET_RDZV_ENDPOINT": "digits-worker-0:23456", "PET_RDZV_BACKEND": "c10d"},
    # Worker-only non-elastic PyTorchJob: PET_NNODES but no MASTER_*, RANK or PET_NODE_RANK
    {"PET_NPROC_PER_NODE": "1", "PET_NNODES": "2"},
], ids=["trainjob", "elastic-pytorchjob", "worker-only"])
def test_pet_without_torchrun(environ: dict[str, str]) -> None:
    with pytest.raises(EnvError) as info:
        DistEnv.from_environ(environ)
    assert "PET_NNODES=" in str(info.value) and "torchrun -m torchjob.trainer" in str(info.value)


def test_pet_single_node_single_process_is_fine() -> None:
    env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0",
           "PET_MASTER_ADDR": "digits-node-0-0.digits", "PET_MASTER_PORT": "29500"}
    assert DistEnv.from_environ(env).source == "single"


@pytest.mark.parametrize("environ, names", [
    (SBATCH_SCRIPT, ["SLURM_NTASKS=4", "SLURM_STEP_ID", "srun"]),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}, ["SLURM_NTASKS=2", "srun"]),  # salloc shell
    ({**SRUN_2X2_TASK3, "SLURM_LOCALID": "2"}, ["SLURM_LOCALID=2", "SLURM_STEP_TASKS_PER_NODE"]),
    ({**SRUN_2X2_TASK3, "SLURM_PROCID": "4"}, ["SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS=4"]),
    ({**SRUN_2X2_TASK3, "SLURM_STEP_TASKS_PER_NODE": "2,1"},
     ["SLURM_STEP_TASKS_PER_NODE=2,1", "SLURM_STEP_NUM_TASKS=4"]),
    ({**SRUN_2X2_TASK3, "SLURM_NODEID": "2"}, ["SLURM_NODEID=2", "2 nodes"]),
    ({**SRUN_2X2_TASK3, "SLURM_STEP_TASKS_PER_NODE": "2x2"}, ["SLURM_STEP_TASKS_PER_NODE='2x2'"]),
    ({**SRUN_2X2_TASK3, "SLURM_STEP_NODELIST": "gpu-[03-"}, ["SLURM_STEP_NODELIST='gpu-[03-'"]),
    ({k: v for k, v in SRUN_2X2_TASK3.items() if k != "SLURM_PROCID"}, ["SLURM_PROCID"]),
    ({k: v for k, v in SRUN_2X2_TASK3.items() if "TASKS_PER_NODE" not in k},
     ["SLURM_STEP_TASKS_PER_NODE"]),
    ({k: v for k, v in SRUN_2X2_TASK3.items() if "NODELIST" not in k},
     ["SLURM_STEP_NODELIST", "MASTER_ADDR"]),
], ids=["sbatch", "salloc", "localid", "procid", "tasks-sum", "nodeid", "tpn-format",
        "nodelist-format", "no-procid", "no-tpn", "no-nodelist"])
def test_slurm_contradictions(environ: dict[str, str], names: list[str]) -> None:
    with pytest.raises(EnvError) as info:
        DistEnv.from_environ(environ)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("environ, names", [
    ({k: v for k, v in OPENMPI_RANK2.items() if not k.startswith("MASTER")},
     ["OMPI_COMM_WORLD_SIZE=4", "MASTER_ADDR", "MASTER_PORT", "mpirun -x MASTER_ADDR="]),
    ({k: v for k, v in MPICH_RANK1.items() if k != "MASTER_PORT"},
     ["PMI_SIZE=2", "MASTER_PORT", "mpiexec -genv"]),
    ({"OMPI_COMM_WORLD_RANK": "0"}, ["OMPI_COMM_WORLD_SIZE is not set"]),
    ({"PMI_SIZE": "2"}, ["PMI_RANK is not set"]),
    ({**OPENMPI_RANK2, "OMPI_COMM_WORLD_RANK": "4"},
     ["OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4"]),
    ({k: v for k, v in MPICH_RANK1.items() if k != "MPI_LOCALRANKID"},
     ["MPI_LOCALRANKID=<unset>", "MPI_LOCALNRANKS=2"]),
], ids=["ompi-no-master", "mpich-no-port", "ompi-half", "pmi-half", "ompi-rank", "mpich-local"])
def test_mpi_contradictions(environ: dict[str, str], names: list[str]) -> None:
    with pytest.raises(EnvError) as info:
        DistEnv.from_environ(environ)
    for name in names:
        assert name in str(info.value)


def test_mpi_single_process_needs_no_rendezvous() -> None:
    env = DistEnv.from_environ({"PMI_RANK": "0", "PMI_SIZE": "1"})
    assert fields(env) == (0, 0, 1, 1, 0, "127.0.0.1", 29500, "mpi")


@pytest.mark.parametrize("hostlist, hosts", [
    ("n1", ["n1"]),
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("gpu-[01-04]", ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("rack1-n[001-003]", ["rack1-n001", "rack1-n002", "rack1-n003"]),
    ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("r[1-2]n[3-4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
    ("x,y[7],z-[2,4]", ["x", "y7", "z-2", "z-4"]),
    ("host.example.com,10.0.0.1", ["host.example.com", "10.0.0.1"]),
])
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts
    assert first_host(hostlist) == hosts[0]


@pytest.mark.parametrize("hostlist", ["", "n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[[1]]",
                                      "a,,b", "n[1-]", "n[]"])
def test_expand_hostlist_rejects(hostlist: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(hostlist)


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]),
    ("1,2(x2),3", [1, 2, 2, 3]), ("8(x1)", [8]),
])
def test_parse_tasks_per_node(text: str, counts: list[int]) -> None:
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2x3", "2(3)", "2(x0)", "-1", "2,,1", "2(x3"])
def test_parse_tasks_per_node_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_tasks_per_node(text)


def test_slurm_port() -> None:
    assert slurm_port(0) == 12000 and slurm_port(19999) == 31999 and slurm_port(20000) == 12000
    assert len({slurm_port(job) for job in range(100000, 120000)}) == 20000
    assert all(12000 <= slurm_port(job) < 32768 for job in range(0, 200000, 997))
    with pytest.raises(ValueError):
        slurm_port(-1)


@pytest.mark.integration
def test_real_torchrun_two_workers() -> None:
    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items()
           if k not in launcher and not k.startswith(("SLURM_", "OMPI_", "PMI_", "PET_",
                                                      "TORCHELASTIC_"))}
    # one write per line: both workers share torchrun's stdout, and unbuffered (as CI runs
    # Python) print() writes the text and its newline apart, gluing the two lines together
    code = "import sys; from torchjob.trainer.env import DistEnv; " \
           "sys.stdout.write(f'{DistEnv.from_environ()}\\n')"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
         "--no-python", sys.executable, "-c", code],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("DistEnv(")]
    assert len(lines) == 2, result.stdout + result.stderr
    seen = {}
    for line in lines:
        got = dict(re.findall(r"(\w+)=('[^']*'|\d+)", line))
        seen[int(got["rank"])] = got
    assert sorted(seen) == [0, 1]
    for rank, got in seen.items():
        assert got["local_rank"] == str(rank)
        assert (got["world_size"], got["local_world_size"], got["node_rank"]) == ("2", "2", "0")
        assert got["source"] == "'torchrun'" and got["restart_count"] == "0"
    assert seen[0]["master_addr"] == seen[1]["master_addr"]
    assert seen[0]["master_port"] == seen[1]["master_port"]
    assert seen[0]["run_id"] == seen[1]["run_id"] != "''"


def test_more_local_ranks_than_gpus_are_refused_with_both_ways_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default job's two processes on a one-GPU machine: one process per GPU, or the CPU
    with the GPUs hidden (torch.cuda is stood in for: this needs no GPU)."""
    import torch

    from torchjob.trainer.config import ConfigError
    from torchjob.trainer.dist import pick_backend
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    env = DistEnv.from_environ({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                                "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
                                "MASTER_PORT": "1"})
    assert pick_backend("auto", DistEnv.from_environ({**env.export(), "RANK": "0",
                                                      "LOCAL_RANK": "0"}))[1].type == "cuda"
    with pytest.raises(ConfigError, match=r"LOCAL_RANK=1 but only 1 CUDA device\(s\) are "
                       r"visible: start at most one process per GPU \(nproc_per_node <= GPUs "
                       r"per node, here 1\), or train on the CPU with them hidden "
                       r"\(CUDA_VISIBLE_DEVICES= in the environment"):
        pick_backend("auto", env)

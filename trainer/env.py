"""Where this process stands in a distributed job, read once from the launcher's environment.

``DistEnv.from_environ()`` is the one reader of launcher variables; first match wins:
torchrun (``LOCAL_RANK``), one process per pod (``RANK``/``WORLD_SIZE``), ``PET_*`` alone (an
error but for one process), an srun step and/or MPI, else one process. Unset and empty are
the same; contradictions raise ``EnvError`` (exit 2) naming the variables and the fix.
Standard library only (the rules in full: docs/internals.md).
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from typing import Mapping, NamedTuple

DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 29500
_PET_WORLD = ("PET_NNODES", "PET_MASTER_ADDR", "PET_NODE_RANK", "PET_RDZV_ENDPOINT")
_TORCHRUN = "torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and " \
            "MASTER_PORT together for every worker"


class EnvError(ValueError):
    """A contradictory or incomplete launcher environment (exit code 2).

    The message names the variables, their values and what would be accepted."""


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """This process's place in the job: ranks, sizes, rendezvous address and who said so."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int  # GROUP_RANK under torchrun, SLURM_NODEID, ... (0 when unknown or single)
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm", "mpi", "k8s-pod" or "single"
    restart_count: int = 0  # TORCHELASTIC_RESTART_COUNT (0 under other launchers)
    run_id: str = ""  # TORCHELASTIC_RUN_ID or SLURM_JOB_ID

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        """Read the launcher's variables (``os.environ`` by default) in the order above."""
        env = os.environ if environ is None else environ
        if _get(env, "LOCAL_RANK") is not None:
            return _from_torchrun(env)
        if _get(env, "RANK") is not None or _get(env, "WORLD_SIZE") is not None:
            return _from_pod(env)
        _reject_pet_without_torchrun(env)
        return _from_slurm_or_mpi(env) or _from_nothing(env)

    def export(self) -> dict[str, str]:
        """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: what
        ``init_process_group(init_method="env://")`` reads, whatever the source was."""
        return {"RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank),
                "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(self.local_world_size),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


SLURM_PORTS = range(12000, 32000)  # slurm_port's; slurm/job.sh writes the same in bash


def slurm_port(job_id: int) -> int:
    """The rendezvous port of Slurm job ``job_id``: ``12000 + job_id % 20000`` (12000..31999).

    Two jobs sharing a node get different ports unless their ids differ by a multiple of 20000,
    and the range stays below Linux's ephemeral ports (32768-60999), which outgoing
    connections may hold. The Slurm backend uses this same function."""
    if job_id < 0:
        raise ValueError(f"a Slurm job id is >= 0, not {job_id}")
    return SLURM_PORTS.start + job_id % len(SLURM_PORTS)


def expand_hostlist(hostlist: str) -> list[str]:
    """All hosts of a Slurm hostlist, in order: ``n[1-2],gpu-[08-10]-ib`` -> n1 n2 gpu-08-ib ...

    Commas inside brackets separate ranges, outside they separate host groups; a range keeps
    the zero padding of its lower bound; several brackets in one name multiply out."""
    hosts: list[str] = []
    for group in _split_outside_brackets(hostlist.strip()):
        parts = re.split(r"\[([^\[\]]*)\]", group)
        literals = parts[0::2]
        if not group or any(ch in lit for lit in literals for ch in "[],"):
            raise ValueError(f"{group!r} is not a host name or prefix[ranges]suffix")
        choices = [[p] if i % 2 == 0 else _expand_ranges(p) for i, p in enumerate(parts)]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def first_host(hostlist: str) -> str:
    """The first host of a Slurm hostlist (rank 0's node): ``rack1-n[001-010]`` -> rack1-n001."""
    return expand_hostlist(hostlist)[0]


def parse_tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed per-node task counts, one entry per node: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None or match.group(2) in ("0", "00"):
            raise ValueError(f"{item!r} is not N or N(xM)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _split_outside_brackets(text: str) -> list[str]:
    groups, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced or nested brackets in {text!r}")
        if ch == "," and depth == 0:
            groups.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unclosed '[' in {text!r}")
    return groups + [text[start:]]


def _expand_ranges(body: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if match is None or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise ValueError(f"[{body}]: {item!r} is not N or LOW-HIGH with LOW <= HIGH")
        low, width = int(match.group(1)), len(match.group(1))
        out.extend(f"{n:0{width}d}" for n in range(low, int(match.group(2) or low) + 1))
    return out


def _get(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, with unset and empty (``X=``) both meaning absent."""
    value = env.get(name)
    return value.strip() if value is not None and value.strip() else None


def _int(env: Mapping[str, str], name: str, minimum: int = 0,
         maximum: int | None = None) -> int | None:
    """A whole-number variable within bounds, or None when unset; anything else is an EnvError."""
    raw = _get(env, name)
    if raw is None:
        return None
    accepted = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    if re.fullmatch(r"[+-]?\d+", raw) is None:
        raise EnvError(f"{name}={raw!r} is not a whole number; expected {accepted}")
    value = int(raw)
    if value < minimum or (maximum is not None and value > maximum):
        raise EnvError(f"{name}={raw} is out of range; expected {accepted}")
    return value


def _need(env: Mapping[str, str], name: str, why: str, minimum: int = 0) -> int:
    value = _int(env, name, minimum)
    if value is None:
        raise EnvError(f"{name} is not set, but {why}")
    return value


def _first_set(env: Mapping[str, str], *names: str) -> str | None:
    return next((n for n in names if _get(env, n) is not None), None)


def _port(env: Mapping[str, str]) -> int | None:
    return _int(env, "MASTER_PORT", 1, 65535)


def _rendezvous(env: Mapping[str, str], world: int, context: str, fix: str) -> tuple[str, int]:
    """MASTER_ADDR/MASTER_PORT: required when several processes must meet, defaults for one."""
    addr, port = _get(env, "MASTER_ADDR"), _port(env)
    if world > 1 and (addr is None or port is None):
        raise EnvError(f"{context} gives {world} processes but MASTER_ADDR={addr or '<unset>'} "
                       f"and MASTER_PORT={env.get('MASTER_PORT') or '<unset>'}: both are needed "
                       f"for rank 0's rendezvous; {fix}")
    return addr or DEFAULT_ADDR, port or DEFAULT_PORT


def _checked(names: tuple[str, str, str, str], rank: int, local_rank: int, world: int,
             local_world: int, *, source: str, node_rank: int, master_addr: str,
             master_port: int, restart_count: int = 0, run_id: str = "",
             where: str = "") -> DistEnv:
    """Build a DistEnv after the checks every source shares; ``names`` are its four variables."""
    r, lr, w, lw = names
    if rank >= world:
        raise EnvError(f"{r}={rank} but {w}={world}: ranks run from 0 to {world - 1}; one of "
                       "the two is stale or was set by hand")
    if local_rank >= local_world or local_world > world:
        raise EnvError(f"{lr}={local_rank}, {lw}={local_world}{where} and {w}={world} do not fit:"
                       f" local ranks run from 0 to {lw}-1 and {lw} <= {w}")
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world,
                   local_world_size=local_world, node_rank=node_rank, master_addr=master_addr,
                   master_port=master_port, source=source, restart_count=restart_count,
                   run_id=run_id)


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    """torchrun / TorchX / torchelastic: per-process values, also inside Kubernetes pods."""
    why = f"LOCAL_RANK={_get(env, 'LOCAL_RANK')} is set and {_TORCHRUN}; unset the stray " \
          "LOCAL_RANK, or start the trainer with `torchrun -m torchjob.trainer`"
    rank, world = _need(env, "RANK", why), _need(env, "WORLD_SIZE", why, 1)
    local_rank, local_world = _need(env, "LOCAL_RANK", why), _need(env, "LOCAL_WORLD_SIZE", why, 1)
    group_rank = _int(env, "GROUP_RANK")
    addr, port = _rendezvous(env, world, f"WORLD_SIZE={world}", f"{_TORCHRUN}; when setting "
                             "them by hand set MASTER_ADDR=<rank 0 host> MASTER_PORT=<free port>")
    return _checked(("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"), rank, local_rank,
                    world, local_world, source="torchrun", master_addr=addr, master_port=port,
                    node_rank=group_rank if group_rank is not None else rank // local_world,
                    restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT") or 0,
                    run_id=_get(env, "TORCHELASTIC_RUN_ID") or "")


def _from_pod(env: Mapping[str, str]) -> DistEnv:
    """RANK/WORLD_SIZE without LOCAL_RANK: one process per pod (or host), e.g. a PyTorchJob."""
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", 1)
    if rank is None or world is None:
        have, miss = ("RANK", "WORLD_SIZE") if world is None else ("WORLD_SIZE", "RANK")
        raise EnvError(f"{have}={_get(env, have)} is set but {miss} is not: torch's env:// "
                       f"needs both (and MASTER_ADDR/MASTER_PORT); set {miss} or unset {have}")
    if _get(env, "LOCAL_WORLD_SIZE") is not None:
        raise EnvError(f"LOCAL_WORLD_SIZE={_get(env, 'LOCAL_WORLD_SIZE')} is set but LOCAL_RANK "
                       f"is not; {_TORCHRUN}: set LOCAL_RANK too, or unset LOCAL_WORLD_SIZE")
    nproc = _get(env, "PET_NPROC_PER_NODE")
    if nproc is not None and nproc.isdigit() and int(nproc) > 1:
        raise EnvError(f"RANK={rank} and WORLD_SIZE={world} are per pod (the PyTorchJob "
                       f"operator sets them), PET_NPROC_PER_NODE={nproc} asks for {int(nproc)} "
                       "processes per pod, and LOCAL_RANK is not set: start the trainer with "
                       "`torchrun -m torchjob.trainer`, which reads PET_* and gives every "
                       "process its own RANK, LOCAL_RANK and WORLD_SIZE")
    addr, port = _rendezvous(env, world, f"WORLD_SIZE={world}", "the PyTorchJob operator sets "
                             "both when the job has a Master; set them, or start with torchrun")
    return _checked(("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"), rank, 0, world, 1,
                    source="k8s-pod", node_rank=rank, master_addr=addr, master_port=port)


def _reject_pet_without_torchrun(env: Mapping[str, str]) -> None:
    """A TrainJob or elastic PyTorchJob pod started without torchrun: nobody assigned ranks."""
    found = {n: v for n in _PET_WORLD + ("PET_NPROC_PER_NODE",) if (v := _get(env, n)) is not None}
    if not found.keys() & set(_PET_WORLD):
        return
    if found.get("PET_NNODES") in ("1", "1:1") and found.get("PET_NPROC_PER_NODE") in (None, "1"):
        return  # one node of one process: running alone is what torchrun would do too
    shown = ", ".join(f"{n}={v}" for n, v in found.items())
    raise EnvError(f"{shown} are set but RANK and LOCAL_RANK are not: this pod belongs to a "
                   "TrainJob or an elastic PyTorchJob, whose operator leaves starting the "
                   "processes to torchrun. Start the trainer with `torchrun -m "
                   "torchjob.trainer` (it reads the PET_* variables)")


class _Mpi(NamedTuple):
    label: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    fix: str


_MPIS = (
    _Mpi("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE", "pass them with `mpirun -x MASTER_ADDR=<rank 0 host> "
         "-x MASTER_PORT=<free port> ...`"),
    _Mpi("MPICH/Intel MPI (Hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
         "pass them with `mpiexec -genv MASTER_ADDR <rank 0 host> -genv MASTER_PORT <free port> "
         "...`"),
)


def _from_slurm_or_mpi(env: Mapping[str, str]) -> DistEnv | None:
    """srun step or mpirun (step 4 above); srun --mpi=pmi2 sets PMI_* that match SLURM_*."""
    mpi = next((m for m in _MPIS if _first_set(env, m.rank, m.size)), None)
    step = _first_set(env, "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS") is not None
    if mpi is not None and step:
        slurm_size = _first_set(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        agree = (_int(env, mpi.rank), _int(env, mpi.size)) == (
            _int(env, "SLURM_PROCID"), _int(env, slurm_size) if slurm_size else None)
        return _from_slurm(env) if agree else _from_mpi(env, mpi)
    if mpi is not None:
        return _from_mpi(env, mpi)
    if step:
        return _from_slurm(env)
    ntasks_name = _first_set(env, "SLURM_NTASKS", "SLURM_NPROCS")
    ntasks = _int(env, ntasks_name, 1) if ntasks_name else None
    if ntasks is not None and ntasks > 1:
        raise EnvError(f"{ntasks_name}={ntasks} but SLURM_STEP_ID is not set: this is the sbatch "
                       "script (or salloc shell) itself, not one of the job's tasks. Start the "
                       "trainer with `srun python -m torchjob.trainer` (one process per task) or "
                       "`srun torchrun ... -m torchjob.trainer` (one torchrun per node)")
    return None


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    """An srun task without torchrun: ranks from SLURM_*, rank 0 on the first node of the step."""
    why = "srun sets these for every task; start the trainer with `srun python -m torchjob.trainer`"
    world_name = _first_set(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    world = _need(env, world_name or "SLURM_NTASKS", why, 1)
    rank, local_rank = _need(env, "SLURM_PROCID", why), _need(env, "SLURM_LOCALID", why)
    node = _int(env, "SLURM_NODEID") or 0
    tpn_name = _first_set(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    tpn = _get(env, tpn_name) if tpn_name else None
    if tpn_name is None or tpn is None:
        raise EnvError(f"SLURM_STEP_TASKS_PER_NODE is not set, so the tasks on this node are "
                       f"unknown; {why}")
    try:
        counts = parse_tasks_per_node(tpn)
    except ValueError as err:
        raise EnvError(f"{tpn_name}={tpn!r} is not Slurm's N or N(xM) list: {err}") from None
    if node >= len(counts) or sum(counts) != world:
        raise EnvError(f"SLURM_NODEID={node}, {tpn_name}={tpn} ({len(counts)} nodes, "
                       f"{sum(counts)} tasks) and {world_name}={world} contradict each other; "
                       "were some exported by hand or inherited from another job?")
    list_name = _first_set(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    addr = _get(env, "MASTER_ADDR")
    if addr is None and list_name is not None:
        try:
            addr = first_host(env[list_name])
        except ValueError as err:
            raise EnvError(f"{list_name}={env[list_name]!r} is not a Slurm hostlist such as "
                           f"n[1-3,5] ({err}); or set MASTER_ADDR") from None
    job_id, port = _int(env, "SLURM_JOB_ID"), _port(env)
    if port is None and job_id is not None:
        port = slurm_port(job_id)
    if world > 1 and (addr is None or port is None):
        lack = [m for m, bad in (("SLURM_STEP_NODELIST/SLURM_JOB_NODELIST (or MASTER_ADDR) for "
                                  "rank 0's host", addr is None), ("SLURM_JOB_ID (or MASTER_PORT)"
                                  " for the port", port is None)) if bad]
        raise EnvError(f"{world_name}={world} but there is no {' and no '.join(lack)}; {why}")
    return _checked(("SLURM_PROCID", "SLURM_LOCALID", world_name or "SLURM_NTASKS", tpn_name),
                    rank, local_rank, world, counts[node], source="slurm", node_rank=node,
                    where=f" (SLURM_NODEID={node} of {tpn_name}={tpn})",
                    master_addr=addr or DEFAULT_ADDR, master_port=port or DEFAULT_PORT,
                    run_id=_get(env, "SLURM_JOB_ID") or "")


def _from_mpi(env: Mapping[str, str], mpi: _Mpi) -> DistEnv:
    """mpirun/mpiexec: ranks from the MPI launcher; the rendezvous address must be passed in."""
    why = f"{mpi.label}'s launcher sets {mpi.rank} and {mpi.size} together"
    rank, world = _need(env, mpi.rank, why), _need(env, mpi.size, why, 1)
    local_rank, local_world = _int(env, mpi.local_rank), _int(env, mpi.local_size, 1)
    if local_rank is None or local_world is None:
        if world > 1:
            raise EnvError(f"{mpi.rank}={rank} and {mpi.size}={world} are set but {mpi.local_rank}"
                           f"={_get(env, mpi.local_rank) or '<unset>'} and {mpi.local_size}="
                           f"{_get(env, mpi.local_size) or '<unset>'} are not both set, so this "
                           "process's device is unknown; use a launcher that sets them, or "
                           "start the trainer under torchrun")
        local_rank, local_world = 0, 1
    addr, port = _rendezvous(env, world, f"{mpi.size}={world}", f"MPI gives no rendezvous "
                             f"address: {mpi.fix}")
    return _checked((mpi.rank, mpi.local_rank, mpi.size, mpi.local_size), rank, local_rank,
                    world, local_world, source="mpi", node_rank=0, master_addr=addr,
                    master_port=port)


def _from_nothing(env: Mapping[str, str]) -> DistEnv:
    """No launcher: one process, rank 0 of 1 (MASTER_ADDR/MASTER_PORT still honoured)."""
    addr, port = _rendezvous(env, 1, "", "")
    return DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                   master_addr=addr, master_port=port, source="single")

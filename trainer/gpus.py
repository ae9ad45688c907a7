"""A node's GPUs, counted by a fresh interpreter: never in the agent itself, which forks its
workers' server (a process that touched CUDA cannot fork). torchrun's ``--nproc-per-node``
words (``gpu``, ``cpu``, ``auto``) as a count, and the GPUs a job asked for checked before
any worker starts. The local backend counts the same way before any node starts."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from collections.abc import Mapping

from torchjob.trainer.contract import NPROC_WORDS


def nproc_per_node(value: str) -> str:
    """``--nproc-per-node`` (or ``PET_NPROC_PER_NODE``) as a count, torchrun's words counted
    here as torch's ``determine_local_world_size`` does, but without CUDA in this process,
    which forks the workers' server: ``gpu`` the CUDA devices torch sees (``report``),
    ``cpu`` the CPUs this agent may run on (its affinity: what Slurm or docker gave it, where
    torchrun counts the machine's), ``auto`` the GPUs, else the CPUs."""
    word = value.strip()
    if word.isascii() and word.isdigit():
        return word
    if word not in NPROC_WORDS:
        raise ValueError(f"--nproc-per-node {value!r}: write a count of processes per node, "
                         "or gpu (one per GPU), cpu (one per CPU) or auto")
    gpus = 0 if word == "cpu" else report_here()[2]
    if word == "gpu" and not gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError("--nproc-per-node gpu: torch sees no CUDA GPU on this node"
                         f"{f' (CUDA_VISIBLE_DEVICES={visible})' if visible is not None else ''}"
                         ": ask for GPUs (resources.gpus), or give a count of processes")
    count = gpus or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else os.cpu_count() or 1)
    print(f"torchjob: --nproc-per-node {word}: {count} process(es) on this node "
          f"(one per {'GPU' if gpus else 'CPU'})", file=sys.stderr, flush=True)
    return str(count)


# run in a fresh interpreter: torch.cuda here would forbid the fork of the workers' server.
# Its version, whether it is built for GPUs (CUDA or ROCm), and the devices it sees.
COUNT_GPUS = ("import torch; print(torch.__version__, int(bool(torch.version.cuda or "
              "torch.version.hip)), torch.cuda.device_count() if torch.cuda.is_available() "
              "else 0)")


def missing(wanted: int) -> str:
    """Why this node cannot run the job, when it sees fewer GPUs than the job asked for
    (``--expect-gpus``, from resources.gpus); "" when it sees them (or none were asked for). A
    container engine that cannot pass them on (podman, or docker without NVIDIA's toolkit,
    may ignore compose's reservation), a scheduler's node without them or a CPU build of torch
    would otherwise leave the job training on the CPU, silently and many times slower."""
    if not wanted:
        return ""
    version, gpu_build, seen = report_here()
    if seen >= wanted:
        return ""
    asked = f"the job asks for {wanted} GPU(s) per node (resources.gpus), but "
    if not gpu_build:
        return (asked + f"torch {version} on {socket.gethostname()} is built for the CPU "
                "alone: run an image or environment with a CUDA build of torch (the kit's "
                "Dockerfile takes one: --build-arg BASE_IMAGE=pytorch/pytorch:...-cuda...), "
                "or set resources.gpus: 0 to train on the CPU")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (asked + f"torch sees {seen} on {socket.gethostname()}"
            f"{'' if visible is None else f' (CUDA_VISIBLE_DEVICES={visible})'}: the scheduler "
            "or container engine did not give them (docker and podman need NVIDIA's Container "
            "Toolkit, podman its CDI spec: nvidia-ctk cdi generate); or set resources.gpus: 0 "
            "to train on the CPU")


@functools.lru_cache(maxsize=1)
def report_here() -> tuple[str, bool, int]:
    """This node's torch: (version, built for GPUs, devices seen), asked once per agent."""
    return report()


def report(python: str = sys.executable, env: Mapping[str, str] | None = None,
           ) -> tuple[str, bool, int]:
    """(torch's version, whether it is built for GPUs, the CUDA or ROCm devices it sees), from
    a fresh ``python`` in ``env`` (a second or two: the interpreter and environment the
    workers will have); a ValueError that says why when it cannot tell."""
    done = subprocess.run([python, "-c", COUNT_GPUS], capture_output=True, text=True,
                          check=False, env=None if env is None else dict(env))
    words = done.stdout.split()
    if done.returncode != 0 or len(words) < 3 or not words[-1].isdigit():
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise ValueError(f"cannot count this node's GPUs: {lines[-1]}")
    return words[-3], words[-2] == "1", int(words[-1])

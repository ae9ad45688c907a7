"""What a backend may ask of one host: how many node agents it starts there, and which host
directories it may bind-mount into a container. Core: the docker, local and TorchX backends
(one host) and the container backends (bind mounts) call these from their renderers. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import SYSTEM_DIRS, bad, system_dir

__all__ = ["SYSTEM_DIRS", "bind_sources", "on_one_host", "refuse_system_dir", "refuse_system_dirs",
           "system_dir"]

# Node agents (containers, emulated nodes) torchjob starts on one machine: each is a torchrun
# agent with nproc_per_node workers, and even a large host runs a few dozen such containers.
MAX_HOST_NODES = 64


def on_one_host(nodes: int, path: str, backend: str) -> None:
    """``nodes`` node agents on one machine, or a SpecError at ``path`` naming the bound."""
    if nodes > MAX_HOST_NODES:
        raise bad(path, nodes, f"nodes on one host is more than {MAX_HOST_NODES} "
                  f"(MAX_HOST_NODES), the most the {backend} backend starts on one machine: "
                  "use fewer nodes, or a cluster backend (--to slurm, --to k8s)")


def refuse_system_dir(path: str, value: str, workdir: str | None = None, *,
                      host_path: str | None = None) -> None:
    """A SpecError at ``path`` when ``value`` (or ``host_path``, the host directory a backend
    makes of it) is a system directory of the host."""
    found = system_dir(value if host_path is None else host_path, workdir)
    if found is not None:
        use = "write into it or bind-mount it" if path in ("run_dir", "checkpoint_dir") \
            else "bind-mount it"
        raise bad(path, value, f"is the host's system directory {found}: no job may {use}; "
                  "use a directory of your own (e.g. /data/NAME, or a path under the working "
                  "directory)")


def bind_sources(spec: JobSpec, *, run_dirs: bool = True) -> Iterator[tuple[str, str]]:
    """(field path, host path) of what a container backend bind-mounts: ``run_dir`` and
    ``checkpoint_dir`` (``run_dirs``) and each mount whose source is a path."""
    if run_dirs:
        yield "run_dir", spec.run_dir
        yield "checkpoint_dir", spec.checkpoint_dir
    for i, mount in enumerate(spec.mounts):
        if mount.source.startswith(("/", ".")):
            yield f"mounts[{i}].source", mount.source


def refuse_system_dirs(spec: JobSpec, *, workdir: str | None = None,
                       run_dirs: bool = True) -> None:
    """Every bind source of ``spec`` (``bind_sources``) checked with ``refuse_system_dir``."""
    for path, value in bind_sources(spec, run_dirs=run_dirs):
        refuse_system_dir(path, value, workdir)

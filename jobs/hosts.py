"""What a backend may ask of one host: how many node agents it starts there, which host
directories it may bind-mount into a container, and the mounts that keep a container's run
directory on the host. Core: the docker, local and TorchX backends
(one host) and the container backends (bind mounts) call these from their renderers. Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import IMAGE_WORKDIR, SYSTEM_DIRS, SpecError, bad, system_dir

__all__ = ["SYSTEM_DIRS", "bind_sources", "host_path", "on_one_host", "refuse_system_dir",
           "refuse_system_dirs", "run_binds", "system_dir"]

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


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def is_path(source: str) -> bool:
    """Whether a mount's ``source`` names a directory (``/...``, ``./...``, ``../...``, ``.``,
    ``..``), which is bind-mounted, rather than a volume (a bare name, as compose reads it)."""
    return source.startswith(("/", "./", "../")) or source in (".", "..")


def host_path(host_dir: str, path: str) -> str:
    """``path`` on the host: relative ones under ``host_dir``, kept looking like a path
    (``./x``: compose reads a bare ``x`` as a volume name)."""
    joined = posixpath.normpath(posixpath.join(host_dir, path))
    return joined if is_path(joined) else f"./{joined}"


def run_binds(spec: JobSpec, host_dir: str, workdir: str | None = None, *,
              with_workdir: bool = False) -> list[tuple[str, str]]:
    """(host source, container target) of the bind mounts that put run_dir and checkpoint_dir
    of a container of the kit's image on the host: a relative path is resolved under the
    image's working directory and its first component is mounted from ``host_dir`` (``runs/x``
    -> ``HOST_DIR/runs`` at ``/workspace/runs``); an absolute path is mounted from the same
    host path. ``with_workdir``: ``host_dir`` itself at the working directory, which holds
    every relative path.
    Paths already under a spec mount are left to it. A host source that is a system
    directory (relative ones counted from ``workdir``, where the run starts) is refused."""
    targets: list[tuple[str, str]] = []
    if with_workdir:
        refuse_system_dir("docker.mount_workdir", ".", workdir)
        targets.append((host_path(host_dir, "."), IMAGE_WORKDIR))
    for field in ("run_dir", "checkpoint_dir"):
        path = posixpath.normpath(getattr(spec, field))
        if path == ".." or path.startswith("../"):
            raise SpecError(field, f"{getattr(spec, field)!r} leaves the container's working "
                            f"directory ({IMAGE_WORKDIR}): write a path below it or an "
                            "absolute path")
        if path.startswith("/"):
            source, target = path, path
        else:
            top = path.split("/")[0]
            source = host_path(host_dir, top)
            target = IMAGE_WORKDIR if top == "." else f"{IMAGE_WORKDIR}/{top}"
        container_path = path if path.startswith("/") else posixpath.join(IMAGE_WORKDIR, path)
        if any(_inside(container_path, m.target) for m in spec.mounts):
            continue
        refuse_system_dir(field, getattr(spec, field), workdir,
                          host_path=source if path.startswith("/") else top)
        targets.append((source, target))
    binds: list[tuple[str, str]] = []
    for source, target in sorted(set(targets), key=lambda st: st[1]):
        if not any(_inside(target, bound) for _, bound in binds):
            binds.append((source, target))
    return binds

"""The docker backend's renderer: a JobSpec -> a compose file (docker compose, podman-compose).

One service per node (``node0`` ..., an elastic job's spare nodes too), each running the agent
command of ``jobs.command``, the run and checkpoint directories bind-mounted from the host at
the same path in every service; an elastic job's rendezvous store is a service of its own,
``rendezvous``. Pure: the host directory is passed in, so ``--dry-run`` prints what would run.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from torchjob.jobs.command import agent_command, own_store, store_command
from torchjob.jobs.hosts import host_path, is_path, refuse_system_dir, run_binds
from torchjob.jobs.spec import JobSpec
from torchjob.trainer.contract import thread_env

RDZV_HOST = "node0"
STORE_SERVICE = "rendezvous"  # an elastic job's own rendezvous store (torchjob.trainer.store)
HEADER = ("# Rendered by torchjob from {source}; do not edit by hand. Regenerate with\n"
          "#   torchjob render --to docker {source} > compose.yaml\n"
          "# Run: docker compose up (or podman-compose up), or torchjob run --to docker {source}\n"
          "# (which also starts a node container again when it was killed: see x-torchjob)\n")

Obj = dict[str, Any]


def service_name(node: int) -> str:
    """The compose service (and hostname) of node ``node``."""
    return f"node{node}"


RESTARTS = "x-torchjob"  # compose ignores x- keys; the docker launcher reads this one


def restarts(spec: JobSpec) -> Obj:
    """How often ``torchjob run --to docker`` starts a node container again, and when: only
    when it was killed (exit 128+N but 143: the OOM killer, a lost host; PyTorchJob's
    ExitCode policy), never when the job failed (1) or was misconfigured (2), which an
    engine's ``restart: on-failure`` would retry."""
    count = 0 if spec.docker.restart == "no" else spec.max_restarts
    return {"restart": "exit-code" if count else "no", "max_restarts": count}


def mounts_workdir(spec: JobSpec) -> bool:
    """``docker.mount_workdir``; unset: whether the job runs user code (a script or a module
    other than torchjob's trainer, which the image holds)."""
    if spec.docker.mount_workdir is not None:
        return spec.docker.mount_workdir
    return not spec.trainer.builtin


def run_mounts(spec: JobSpec, host_dir: str, workdir: str | None = None) -> list[Obj]:
    """Bind mounts that put run_dir and checkpoint_dir on the host, at the same path in every
    service (``torchjob.jobs.hosts.run_binds``); with the working directory mounted
    (``mounts_workdir``), that one mount of ``host_dir`` at the image's WORKDIR holds every
    relative path."""
    return [{"type": "bind", "source": source, "target": target}
            for source, target in run_binds(spec, host_dir, workdir,
                                            with_workdir=mounts_workdir(spec))]


def spec_mounts(spec: JobSpec, host_dir: str, workdir: str | None = None
                ) -> tuple[list[Obj], Obj]:
    """(service volumes, top-level named volumes) for ``spec.mounts``: a path (``/...``,
    ``./...``) is a bind mount (never of a system directory), any other source a named volume
    shared by all services."""
    mounts: list[Obj] = []
    named: Obj = {}
    for i, mount in enumerate(spec.mounts):
        if is_path(mount.source):
            refuse_system_dir(f"mounts[{i}].source", mount.source, workdir)
            mounts.append({"type": "bind", "source": host_path(host_dir, mount.source),
                           "target": mount.target, "read_only": mount.read_only})
        else:
            mounts.append({"type": "volume", "source": mount.source, "target": mount.target,
                           "read_only": mount.read_only})
            named[mount.source] = {"name": mount.source}
    return mounts, named


def environment(spec: JobSpec) -> Obj:
    """Plain values from ``env``; each secret by name only (``NAME:`` with no value: compose
    passes it through from the environment compose runs in)."""
    # the node's resources.cpu shared by its workers (one thread when unset, as on a laptop
    # where several node containers share the cores)
    env: Obj = {**thread_env(spec.resources.cpu, spec.procs),
                "PYTHONUNBUFFERED": "1", **spec.env}
    env.update({ref.env: None for ref in spec.secrets})
    return env


def limits(spec: JobSpec) -> Obj:
    """``deploy.resources.limits`` from ``resources`` (cpu count, memory in whole MiB)."""
    out: Obj = {}
    if spec.resources.cpu is not None:
        out["cpus"] = format(spec.resources.cpu, "g")
    if spec.resources.memory is not None:
        out["memory"] = f"{spec.resources.memory.mib}M"
    return out


def resources(spec: JobSpec) -> Obj:
    """``deploy.resources``: the limits, and ``resources.gpus`` NVIDIA GPUs reserved the
    compose-spec way (docker compose with the NVIDIA container toolkit)."""
    out: Obj = {}
    if res := limits(spec):
        out["limits"] = res
    if spec.resources.gpus:
        out["reservations"] = {"devices": [{"driver": "nvidia", "count": spec.resources.gpus,
                                            "capabilities": ["gpu"]}]}
    return out


def escape(value: Any) -> Any:
    """Compose interpolates ``$VAR`` and ``${VAR}`` in every string value: ``$$`` is a
    literal ``$``. Applied once, to the whole document, before the renderer adds its own
    ``${TORCHJOB_HOST_DIR:-.}``."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {key: escape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [escape(item) for item in value]
    return value


# A relative bind source in a compose file is relative to the file's own directory. torchjob
# runs keep the file in the run directory, so relative sources start from this variable: unset
# (``docker compose up`` beside the file) it is ``.``; ``torchjob run --to docker`` sets it to
# the directory it was started in. The same text then works both ways.
HOST_DIR_VAR = "TORCHJOB_HOST_DIR"
# The rendezvous id, which also names the run that holds the run directory's lock
# (trainer.runlock): each ``torchjob run --to docker`` sets it to its own project name, so two
# runs of one file are two runs; unset (``docker compose up`` by hand) it is the job's name.
RUN_ID_VAR = "TORCHJOB_RUN_ID"


def _from_host_dir(volume: Obj) -> Obj:
    source = volume["source"]
    if volume["type"] != "bind" or source.startswith("/"):
        return volume
    rest = "" if source == "." else "/" + source.removeprefix("./")
    return {**volume, "source": f"${{{HOST_DIR_VAR}:-.}}{rest}"}


def render_compose(spec: JobSpec, *, host_dir: str = ".", python: str = "python",
                   workdir: str | None = None, user: str | None = None) -> Obj:
    """The compose document: one service per node (nnodes MAX, at most MAX_HOST_NODES), a
    shared run directory. ``host_dir`` ``.`` (the default) makes relative host paths start at
    ``$TORCHJOB_HOST_DIR`` (default ``.``, the compose file's directory); the rendezvous id is
    ``$TORCHJOB_RUN_ID`` (default the job's name). ``workdir``: where the run starts, against
    which relative bind sources are checked (no system directory). ``user`` (``UID:GID``) runs
    the node containers as those ids instead of the image's user (``images.invoking_user``)."""
    store = own_store(spec)
    command = list(agent_command(spec, python=python,
                                 rdzv_endpoint=f"{STORE_SERVICE if store else RDZV_HOST}:"
                                               f"{spec.rdzv.port}",
                                 run_id=spec.name, store_client=store))
    mounts, named = spec_mounts(spec, host_dir, workdir)
    volumes = run_mounts(spec, host_dir, workdir) + mounts
    services: Obj = {}
    if store:  # no GPU, no training memory, no volumes: nothing that fails with a node
        services[STORE_SERVICE] = {"image": spec.image, "hostname": STORE_SERVICE,
                                   "command": list(store_command(spec, python=python)),
                                   "environment": {"PYTHONUNBUFFERED": "1"},
                                   "restart": "no"}
    for node in range(spec.nnodes.max):
        name = service_name(node)
        service: Obj = {"image": spec.image, "hostname": name, "command": command,
                        "environment": environment(spec), "volumes": volumes,
                        "shm_size": f"{spec.resources.shm.mib}m",
                        # an engine restarts on any exit but 0, a failed job's 1 too: node
                        # containers are started again by the launcher (jobs.backends.docker
                        # .launch), only when killed
                        "restart": "no"}
        if user is not None:
            service["user"] = user
        if deploy := resources(spec):
            service["deploy"] = {"resources": deploy}
        if store:  # started first, so that its name resolves
            service["depends_on"] = [STORE_SERVICE]
        elif node:  # node0 hosts the rendezvous: start it first so that its name resolves
            service["depends_on"] = [service_name(0)]
        services[name] = service
    services = escape(services)
    for name, service in services.items():  # the agent's own --rdzv-id before the user's words
        if name == STORE_SERVICE:
            continue
        words = service["command"]
        words[words.index("--rdzv-id") + 1] = f"${{{RUN_ID_VAR}:-{spec.name}}}"
        if host_dir == ".":
            service["volumes"] = [_from_host_dir(v) for v in service["volumes"]]
    doc: Obj = {"name": spec.name, "x-torchjob": restarts(spec), "services": services}
    if named:
        doc["volumes"] = escape(named)
    return doc


# Plain scalars that YAML 1.2 (docker compose's parser) reads as numbers, though PyYAML's
# YAML 1.1 leaves them unquoted: 1e3, 0o17, 1_000, .5e1. They are quoted.
_YAML12_NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?"
                            r"|0o[0-7]+|0x[0-9a-fA-F]+|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


class _Dumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that also quotes strings a YAML 1.2 parser would take as numbers."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "'" if _YAML12_NUMBER.fullmatch(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def compose_text(doc: Obj, *, source: str | None = None) -> str:
    """The document as YAML, dumped once (every string quoted where YAML 1.1 or 1.2 needs)."""
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return (HEADER.format(source=source) if source else "") + str(body)

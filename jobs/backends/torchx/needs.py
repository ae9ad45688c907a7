"""What a TorchX scheduler needs on this machine, checked before torchjob hands it a job: its
Python packages and commands (to render the job at all), then the cluster it talks to (to
submit, follow, cancel or list). Each missing piece is one line that names it and the fix
(a ``TorchxError``, exit 2). Unchecked, TorchX fails from deep inside: a NameError for ray
without ray, ``No host specified`` for kubernetes without a kubeconfig, a DockerException for
local_docker without a Docker API."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torchx.schedulers import get_scheduler_factories

from torchjob.jobs.backend import BackendError
from torchjob.jobs.values import UserError

T = TypeVar("T")


class TorchxError(BackendError):
    """A scheduler or handle TorchX cannot use: one line, exit 2."""


_KUBERNETES = (("kubernetes", "kubernetes (pip install 'torchjob[k8s]')"),)
# scheduler -> the modules its TorchX module imports, each with what to install
PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "local_docker": (("docker", "docker"),),
    "kubernetes": _KUBERNETES,
    "kubernetes_mcad": _KUBERNETES,
    "ray": (("ray", "'ray[default]'"),),
    "aws_batch": (("boto3", "boto3"),),
    "aws_sagemaker": (("boto3", "boto3"), ("sagemaker", "sagemaker")),
    "gcp_batch": (("google.cloud.batch_v1", "google-cloud-batch"),
                  ("google.cloud.logging", "google-cloud-logging"),
                  ("google.cloud.runtimeconfig", "google-cloud-runtimeconfig")),
}
# commands the scheduler runs: to render (its dryrun asks the cluster), then to use a job
RENDER_COMMANDS: dict[str, tuple[str, ...]] = {"lsf": ("bhosts",)}
COMMANDS: dict[str, tuple[str, ...]] = {"slurm": ("sbatch", "sacct", "scancel"),
                                        "lsf": ("bsub", "bjobs", "bkill")}
DOCKER_API_FIX = ("start Docker, or podman's Docker-compatible API (podman system service "
                  "--time=0 unix:///run/podman/podman.sock, then export DOCKER_HOST=unix:///run/"
                  "podman/podman.sock); or run the job with --to docker, which needs compose "
                  "alone")


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def renderable(scheduler: str) -> None:
    """A scheduler TorchX knows, with the packages and commands it needs to render a job."""
    known = get_scheduler_factories()
    if scheduler not in known:
        raise TorchxError(f"unknown TorchX scheduler {scheduler!r}; choose from "
                          f"{', '.join(known)}")
    missing = [pip for module, pip in PACKAGES.get(scheduler, ()) if not _has(module)]
    if missing:
        raise TorchxError(f"TorchX's {scheduler} scheduler needs Python package(s) not "
                          f"installed here: pip install {' '.join(missing)}")
    _commands(scheduler, RENDER_COMMANDS.get(scheduler, ()))


def _commands(scheduler: str, commands: tuple[str, ...]) -> None:
    missing = [name for name in commands if shutil.which(name) is None]
    if missing:
        every = (*RENDER_COMMANDS.get(scheduler, ()), *COMMANDS.get(scheduler, ()))
        raise TorchxError(f"TorchX's {scheduler} scheduler runs the cluster's commands "
                          f"({', '.join(every)}), and this machine has no {missing[0]} on "
                          "PATH: run torchjob on a machine of the cluster (a login node), or "
                          "add its tools to PATH")


def reachable(scheduler: str) -> None:
    """All that ``renderable`` checks, and the cluster the scheduler submits to answers."""
    renderable(scheduler)
    _commands(scheduler, COMMANDS.get(scheduler, ()))
    if scheduler == "local_docker":
        _docker_api()
    elif scheduler in ("kubernetes", "kubernetes_mcad"):
        _kubeconfig(scheduler)


def _docker_api() -> None:
    import docker  # checked by renderable
    where = os.environ.get("DOCKER_HOST") or "the default socket, /var/run/docker.sock"
    try:
        docker.from_env(timeout=10).close()
    except docker.errors.DockerException as exc:
        raise TorchxError(f"TorchX's local_docker scheduler runs containers through a Docker "
                          f"API, and none answers at {where} ({_short(exc)}): "
                          f"{DOCKER_API_FIX}") from None


def _ask_docker_api(ask: Callable[[Any], T]) -> T | None:
    """``ask(client)`` of the Docker API (``DOCKER_HOST``, else the default socket); None
    when none answers."""
    import docker
    client = docker.from_env(timeout=10)
    try:
        return ask(client)
    except docker.errors.DockerException:
        return None
    finally:
        client.close()


def docker_engine() -> str | None:
    """The engine behind the Docker API (``podman`` or ``docker``) when its command is here,
    to build the kit's image with as ``torchjob run --to docker`` does; else None."""
    parts = _ask_docker_api(lambda client: client.version().get("Components") or [])
    if parts is None:
        return None
    engine = "podman" if any("podman" in str(part.get("Name", "")).lower() for part in parts) \
        else "docker"
    return engine if shutil.which(engine) else None


def docker_rootless() -> bool:
    """Whether the engine behind the Docker API runs containers in a user namespace of this
    user's (rootless podman or Docker); False for root, or when no API answers."""
    if os.getuid() == 0:
        return False
    info = _ask_docker_api(lambda client: client.info())
    if info is None:
        return False
    return info.get("Rootless") is True or \
        any("rootless" in str(option) for option in info.get("SecurityOptions") or ())


def _kubeconfig(scheduler: str) -> None:
    """TorchX's Kubernetes schedulers read a kubeconfig alone (not a pod's service account)."""
    from kubernetes import client, config
    try:
        config.load_kube_config(client_configuration=client.Configuration())
    except (config.ConfigException, OSError) as exc:
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise TorchxError(f"TorchX's {scheduler} scheduler finds no cluster in {where} "
                          f"({_short(exc)}): set KUBECONFIG to a kubeconfig whose current "
                          "context is the cluster") from None


def _short(exc: BaseException) -> str:
    """``Type: text`` on one line, without the reprs of objects (urllib3 writes them in)."""
    text = re.sub(r"<[^<>]* object at 0x[0-9a-f]+>:? ?", "", " ".join(str(exc).split()))
    return f"{type(exc).__name__}: {text[:400]}"


@contextlib.contextmanager
def scheduler_errors(scheduler: str, doing: str) -> Iterator[None]:
    """What TorchX raises while ``doing`` (``to submit the job``, ...) as one line: what is
    missing when ``reachable`` finds it, else the scheduler's own error, named."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - TorchX's schedulers raise anything at all
        reachable(scheduler)
        raise TorchxError(f"TorchX's {scheduler} scheduler failed {doing}: "
                          f"{_short(exc)}") from None

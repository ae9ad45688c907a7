"""TorchX's ``local_docker`` scheduler, taught the container states that podman reports:
``stopped`` reads as ``exited``, ``configured`` as ``created``, ``stopping`` as ``running``,
and an unknown state as UNKNOWN rather than a crash. pyproject.toml registers it in TorchX's
``torchx.schedulers`` entry points, beside every other built-in scheduler (docs/internals.md).
"""

from __future__ import annotations

from typing import Any

from torchx.schedulers.docker_scheduler import CONTAINER_STATE, DockerScheduler
from torchx.specs import AppState

# podman state -> the Docker state it stands for
PODMAN_STATES = {"stopped": "exited", "configured": "created", "stopping": "running"}


class DockerOrPodmanScheduler(DockerScheduler):
    """``DockerScheduler`` that also understands podman's Docker-API container states."""

    def _get_app_state(self, container: Any) -> AppState:
        status = PODMAN_STATES.get(container.status, container.status)
        if status == "exited":
            # neither engine has success/failure states: the exit code decides
            code = container.wait(timeout=10)["StatusCode"]
            return AppState.SUCCEEDED if code == 0 else AppState.FAILED
        return CONTAINER_STATE.get(status, AppState.UNKNOWN)


def create_scheduler(session_name: str, **kwargs: Any) -> DockerScheduler:
    return DockerOrPodmanScheduler(session_name=session_name)

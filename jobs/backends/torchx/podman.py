"""TorchX's ``local_docker`` scheduler, taught the container states that podman reports.

podman serves the Docker API, but its container states are not all Docker's. Between a
container's exit and podman's clean-up of it (a few hundred milliseconds, longer under
load), podman 4.x reports ``stopped``; TorchX 0.7's ``DockerScheduler`` knows only Docker's
states and fails ``torchx run --wait`` with ``KeyError: 'stopped'``. This subclass reads
``stopped`` as ``exited`` (the exit code decides success), ``configured`` as ``created``
and ``stopping`` as ``running``, and an unknown state as UNKNOWN rather than a crash.

pyproject.toml registers it as ``local_docker`` in TorchX's ``torchx.schedulers`` entry-point
group. A registered group replaces TorchX's built-in table, so every other built-in
scheduler is registered there too, pointing at TorchX's own module; a test checks that the
two tables name the same schedulers.
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

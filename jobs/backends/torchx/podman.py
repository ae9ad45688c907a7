"""TorchX's ``local_docker`` scheduler, taught the container states that podman reports:
``stopped`` reads as ``exited``, ``configured`` as ``created``, ``stopping`` as ``running``,
and an unknown state as UNKNOWN rather than a crash; and a stop as the kit's: a cancel gives
every container its stop grace, and an app whose nodes stopped after a checkpoint (exit 143)
reads as CANCELLED, as local_cwd reports a cancelled app; and TorchX's network made under a
lock file of the user's own. pyproject.toml registers it in TorchX's ``torchx.schedulers``
entry points, beside every other built-in scheduler (docs/internals.md).
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

from torchx.schedulers import docker_scheduler
from torchx.schedulers.docker_scheduler import CONTAINER_STATE, NETWORK, DockerScheduler
from torchx.schedulers.api import DescribeAppResponse
from torchx.specs import AppState

from torchjob.trainer.contract import EXIT_OK, EXIT_STOPPED

# seconds from a container's stop signal to its kill, written by torchjob's render (the job's
# stop_grace); without it, docker's default
STOP_GRACE_LABEL = "io.torchjob.stop-grace"
DEFAULT_STOP_GRACE_S = 10
# podman state -> the Docker state it stands for
PODMAN_STATES = {"stopped": "exited", "configured": "created", "stopping": "running"}


class DockerOrPodmanScheduler(DockerScheduler):
    """``DockerScheduler`` that also understands podman's Docker-API container states."""

    def __init__(self, session_name: str) -> None:
        super().__init__(session_name)
        self._streams: Any = None  # the client that follows logs (_get_container)
        self._streams_lock = threading.Lock()

    def _get_app_state(self, container: Any) -> AppState:
        status = PODMAN_STATES.get(container.status, container.status)
        if status == "exited":
            # neither engine has success/failure states: the exit code decides
            code = container.wait(timeout=10)["StatusCode"]
            return {EXIT_OK: AppState.SUCCEEDED,
                    EXIT_STOPPED: AppState.CANCELLED}.get(code, AppState.FAILED)
        return CONTAINER_STATE.get(status, AppState.UNKNOWN)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """TorchX's, but for an app whose containers ended stopped (and some finished):
        CANCELLED, not FAILED, so that its ``torchjob run`` ends 143 (stopped, resumable)."""
        found = super().describe(app_id)
        if found is not None and found.state == AppState.FAILED:
            states = {r.state for role in found.roles_statuses for r in role.replicas}
            if AppState.CANCELLED in states and states <= {AppState.CANCELLED,
                                                             AppState.SUCCEEDED}:
                found.state = AppState.CANCELLED
        return found

    def _get_container(self, app_id: str, role: str, replica_id: int) -> Any:
        """TorchX's, through a client without a read timeout: ``log_iter`` alone calls this,
        and follows the container's log through it. With the Docker client's default (60 s),
        a container quiet for a minute (a slow start, a long evaluation, a script that prints
        little) ended the stream with a ReadTimeout, and ``torchjob run`` lost the job's later
        lines: its closing line, and the exit code read from it."""
        found = super()._get_container(app_id, role, replica_id)
        with self._streams_lock:
            if self._streams is None:
                import docker
                self._streams = docker.from_env(timeout=None)
        return self._streams.containers.get(found.id)

    def _cancel_existing(self, app_id: str) -> None:
        """Every container's stop signal at once, each killed after its own grace, while the
        caller goes on (its run follows the containers to their end). TorchX stops them one
        after another with the engine's default grace, which podman's Docker API makes none
        (StopTimeout 0: the workers were killed before they could checkpoint)."""
        for container in self._get_containers(app_id):
            grace = int(container.labels.get(STOP_GRACE_LABEL, DEFAULT_STOP_GRACE_S))
            threading.Thread(target=container.stop, kwargs={"timeout": grace},
                             name=f"stop {container.name}", daemon=True).start()


def ensure_network(client: Any = None) -> None:
    """TorchX's ``ensure_network`` (its network, made once however many submit at a time),
    locked by a file of this user's: TorchX's own, one lock file in /tmp made by whichever user
    ran first (mode 644), cannot be opened by any other (PermissionError at every submit)."""
    import docker
    import filelock

    lock = os.path.join(tempfile.gettempdir(), f"torchx_docker_network_lock-{os.getuid()}")
    with filelock.FileLock(lock, timeout=10):
        try:
            (client or docker.from_env()).networks.create(name=NETWORK, driver="bridge",
                                                          check_duplicate=True)
        except docker.errors.APIError as exc:
            if "already exists" not in str(exc):
                raise


def create_scheduler(session_name: str, **kwargs: Any) -> DockerScheduler:
    docker_scheduler.ensure_network = ensure_network  # what DockerScheduler.schedule calls
    return DockerOrPodmanScheduler(session_name=session_name)

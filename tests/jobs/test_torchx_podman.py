"""TorchX's scheduler table as torchjob registers it, and the podman-aware local_docker
(local_cwd's own: tests/jobs/test_torchx_local.py).

The real check (a container caught in podman's ``stopped`` state, and ``torchx run -s
local_docker --wait`` to the end) is in tests/containers/test_torchx_local_docker.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pytest
from torchx.schedulers import DEFAULT_SCHEDULER_MODULES, get_scheduler_factories
from torchx.specs import AppState

from torchjob.jobs.backends.torchx.podman import DockerOrPodmanScheduler


def test_the_registered_table_is_torchx_own_but_for_the_local_schedulers() -> None:
    registered = {ep.name: ep.value for ep in
                  metadata.entry_points().select(group="torchx.schedulers")}
    expected = {name: f"{module}:create_scheduler"
                for name, module in DEFAULT_SCHEDULER_MODULES.items()}
    expected["local_docker"] = "torchjob.jobs.backends.torchx.podman:create_scheduler"
    expected["local_cwd"] = "torchjob.jobs.backends.torchx.local:create_scheduler"
    assert registered == expected


def test_torchx_makes_the_podman_aware_scheduler_for_local_docker() -> None:
    scheduler = get_scheduler_factories()["local_docker"]("test")
    assert isinstance(scheduler, DockerOrPodmanScheduler)


@dataclass
class Container:
    """The two members of docker-py's Container that the state mapping reads."""
    status: str
    code: int = 0

    def wait(self, timeout: int) -> dict[str, Any]:
        return {"StatusCode": self.code}


@pytest.mark.parametrize(("status", "code", "state"), [
    ("stopped", 0, AppState.SUCCEEDED),    # podman: exited, clean-up pending
    ("stopped", 1, AppState.FAILED),
    ("exited", 0, AppState.SUCCEEDED),
    ("exited", 143, AppState.CANCELLED),  # stopped after a checkpoint (EXIT_STOPPED)
    ("exited", 137, AppState.FAILED),
    ("configured", 0, AppState.SUBMITTED),  # podman's name for created
    ("created", 0, AppState.SUBMITTED),
    ("stopping", 0, AppState.RUNNING),
    ("running", 0, AppState.RUNNING),
    ("dead", 0, AppState.FAILED),
    ("something-new", 0, AppState.UNKNOWN),
])
def test_podman_and_docker_states(status: str, code: int, state: AppState) -> None:
    scheduler = DockerOrPodmanScheduler(session_name="test")
    assert scheduler._get_app_state(Container(status, code)) == state

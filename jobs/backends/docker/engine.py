"""The container engine: podman or docker, each with its compose command, found on PATH (the
image a job runs is ``torchjob.jobs.images``')."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torchjob.jobs.images import run_captured
from torchjob.jobs.values import UserError

PROJECT_LABEL = "com.docker.compose.project"  # set by docker compose and podman-compose
INSTALL_HINT = ("install podman and podman-compose (Debian/Ubuntu: apt-get install podman "
                "podman-compose, or scripts/container-setup engine) or Docker with its compose "
                "plugin (docker compose version must work)")


@dataclass(frozen=True)
class Engine:
    """A container engine and the compose command that drives it."""

    name: str  # podman | docker
    compose: tuple[str, ...]  # ("podman-compose",) or ("docker", "compose")

    def compose_argv(self, project: str, file: Path, *args: str) -> list[str]:
        return [*self.compose, "-p", project, "-f", str(file), *args]


def find_engine(choice: str, which: Callable[[str], str | None] = shutil.which) -> Engine:
    """The engine for ``docker.engine``: ``auto`` prefers podman + podman-compose, then
    ``docker compose``. None usable: a UserError that says how to install one."""
    if choice in ("auto", "podman") and which("podman") and which("podman-compose"):
        return Engine("podman", ("podman-compose",))
    if choice in ("auto", "docker") and which("docker") and run_captured(
            ["docker", "compose", "version"], timeout=30).returncode == 0:
        return Engine("docker", ("docker", "compose"))
    wanted = {"auto": "no container engine with compose found",
              "podman": "docker.engine is podman, but podman and podman-compose are not both "
                        "on PATH",
              "docker": "docker.engine is docker, but 'docker compose' does not work"}[choice]
    raise UserError(f"{wanted}: {INSTALL_HINT}")


def down(engine: Engine, project: str, file: Path) -> None:
    """Remove the project's containers and network (podman-compose 1.0 leaves the network)."""
    run_captured(engine.compose_argv(project, file, "down", "-t", "1"), timeout=300)
    if engine.name == "podman":
        nets = run_captured(["podman", "network", "ls", "-q", "--filter",
                             f"label=io.podman.compose.project={project}"],
                            timeout=60).stdout.split()
        if nets:
            run_captured(["podman", "network", "rm", "-f", *nets], timeout=60)

"""The container engine: podman or docker, each with its compose command, found on PATH, and
the image a job runs, built from the recipe this package carries when it is missing."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

import torchjob.trainer
from torchjob.jobs.values import UserError
from torchjob.jobs.workspace import is_registry
from torchjob.trainer.digest import digest as trainer_digest

# the package whose data is the Dockerfile and container-setup
RECIPE = "torchjob.jobs.backends.docker"
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


def run_captured(argv: list[str], timeout: float = 600,
                 **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run an engine command to the end, output captured; shielded from the terminal's Ctrl-C
    (its own session) so that a stop reaches the containers only through the launcher."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, start_new_session=True, check=False,
                              **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


def image_context(dest: Path) -> Path:
    """The Dockerfile's build context, assembled in ``dest`` from what is installed: the
    Dockerfile (package data) and the trainer package, the one of ours the image runs. The same
    from a checkout as from a wheel: nothing is read from the repository's folders."""
    dest.mkdir(parents=True)
    (dest / "Dockerfile").write_bytes(
        importlib.resources.files(RECIPE).joinpath("Dockerfile").read_bytes())
    shutil.copytree(Path(torchjob.trainer.__file__).parent, dest / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


# an image torchjob builds carries the digest of the trainer package in it (trainer/digest.py,
# which scripts/container-setup runs in its build context)
TRAINER_LABEL = "io.torchjob.trainer"


def trainer_label(engine: Engine, image: str) -> str | None:
    """``image``'s ``TRAINER_LABEL`` here ("" when it has none: built by hand); None when
    there is no such image."""
    proc = run_captured([engine.name, "image", "inspect", image], timeout=60)
    if proc.returncode != 0:
        return None
    try:
        info = json.loads(proc.stdout)[0]
        labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    except (ValueError, IndexError, KeyError, AttributeError):
        return ""
    return str(labels.get(TRAINER_LABEL) or "")


def ensure_image(engine: Engine, image: str, err: IO[str]) -> None:
    """Build ``image`` when it is missing locally (a registry image is left to compose to
    pull), or when torchjob built it from another trainer package than the installed one (an
    upgrade: its agent would not know the options this launcher gives it), from the recipe
    this package carries. With podman as root on Debian that is container-setup (a debootstrap
    base, the local torch wheel, no registry); otherwise a plain ``ENGINE build``. An image
    without the label (built by hand) is used as it is."""
    if is_registry(image):
        return
    digest, label = trainer_digest(), trainer_label(engine, image)
    if label is not None and label in ("", digest):
        return
    with tempfile.TemporaryDirectory(prefix="torchjob-image-") as tmp:
        context = image_context(Path(tmp) / "context")
        if engine.name == "podman" and os.geteuid() == 0:
            setup = Path(tmp) / "container-setup"
            setup.write_bytes(
                importlib.resources.files(RECIPE).joinpath("container-setup").read_bytes())
            argv = ["bash", str(setup), "all"]
        else:
            argv = [engine.name, "build", "--label", f"{TRAINER_LABEL}={digest}", "-t", image,
                    str(context)]
        why = "is missing" if label is None else \
            f"holds another torchjob's trainer ({label}; this one's is {digest})"
        print(f"torchjob: image {image} {why}; building it from the Dockerfile torchjob "
              f"ships: {' '.join(argv)}", file=err, flush=True)
        # PYTHON: container-setup downloads the torch wheel with this interpreter's pip
        proc = run_captured(argv, timeout=3600, cwd=tmp,
                            env={**os.environ, "IMAGE": image, "CONTEXT": str(context),
                                 "PYTHON": sys.executable})
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise UserError(f"building image {image} failed:\n{tail}")

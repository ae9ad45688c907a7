"""The kit's image (``localhost/torchjob:latest`` unless the spec says otherwise): built here
from the recipe this package carries (the Dockerfile and container-setup, package data of
``torchjob.jobs``) when it is missing or holds another torchjob's trainer. The docker backend
runs it, TorchX's local_docker scheduler too, and a workspace image is built on top of it."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import torchjob.trainer
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import IMAGE_UID, UserError
from torchjob.trainer.digest import digest as trainer_digest

# the package whose data is the Dockerfile and container-setup
RECIPE = "torchjob.jobs"


def is_registry(repo: str) -> bool:
    """``registry.example/team/x`` or ``host:5000/x``: pushed; ``localhost/x``: stays here."""
    first, slash, _ = repo.partition("/")
    return bool(slash) and first != "localhost" and ("." in first or ":" in first)


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


def trainer_label(engine: str, image: str) -> str | None:
    """``image``'s ``TRAINER_LABEL`` here ("" when it has none: built by hand); None when
    there is no such image."""
    proc = run_captured([engine, "image", "inspect", image], timeout=60)
    if proc.returncode != 0:
        return None
    try:
        info = json.loads(proc.stdout)[0]
        labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    except (ValueError, IndexError, KeyError, AttributeError):
        return ""
    return str(labels.get(TRAINER_LABEL) or "")


def ensure_image(engine: str, image: str, err: IO[str]) -> None:
    """Build ``image`` with ``engine`` (podman or docker) when it is missing locally (a
    registry image is left to the engine to pull), or when torchjob built it from another trainer package than the installed one (an
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
        if engine == "podman" and os.geteuid() == 0:
            setup = Path(tmp) / "container-setup"
            setup.write_bytes(
                importlib.resources.files(RECIPE).joinpath("container-setup").read_bytes())
            argv = ["bash", str(setup), "all"]
        else:
            argv = [engine, "build", "--label", f"{TRAINER_LABEL}={digest}", "-t", image,
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


def host_dirs(spec: JobSpec, cwd: Path) -> list[Path]:
    """The run and checkpoint directories as host paths (relative ones under ``cwd``)."""
    return [cwd / path for path in (spec.run_dir, spec.checkpoint_dir)]


def prepare_dirs(spec: JobSpec, cwd: Path) -> Path:
    """Create the run and checkpoint directories, writable by the image's user; the run dir."""
    for path in host_dirs(spec, cwd):
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # give the tree (earlier runs' checkpoints too) to uid 1000
            for sub in [path, *path.rglob("*")]:
                os.chown(sub, IMAGE_UID, IMAGE_UID, follow_symlinks=False)
        elif os.getuid() != IMAGE_UID:  # for a compose file run as the image's user
            path.chmod(0o777)
    return host_dirs(spec, cwd)[0]


def invoking_user(*, rootless: bool) -> str | None:
    """The ids (``UID:GID``) containers of the kit's image run as when the invoking user is not
    root, so that what a job writes into the directories mounted from here is theirs and a home
    directory only they can read (mode 700) is readable in the containers: the container's root
    under a ``rootless`` engine (podman run by a user, rootless Docker), which is that user on
    the host; their own ids under a daemon that runs as root (Docker, for the docker group).
    Root: None, the image's own user (uid 1000)."""
    if os.getuid() == 0:
        return None
    return "0:0" if rootless else f"{os.getuid()}:{os.getgid()}"


def rootless(engine: str) -> bool:
    """Whether containers that ``engine``'s command (podman, docker) starts for this user run in
    a user namespace of theirs: podman run by a user always does; Docker when its daemon is
    rootless (``docker info``). False for root."""
    if os.getuid() == 0:
        return False
    if engine == "podman":
        return True
    proc = run_captured([engine, "info", "--format", "{{json .SecurityOptions}}"], timeout=60)
    return "rootless" in proc.stdout

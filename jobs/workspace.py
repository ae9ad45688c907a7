"""Code shipped to clusters: a script or module job on a backend whose nodes run an image
(Kubernetes, TorchX's container schedulers) runs in an image built from the working directory
on top of the job's image, as TorchX's workspaces do, or is refused before anything is
submitted, naming the fix.

``decide`` (pure but for reading the working directory) chooses by ``workspace.ship`` and
where the code is; ``build`` builds and pushes the image. The rules: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from torchjob.jobs.images import ensure_image, is_registry
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import IMAGE_UID, IMAGE_WORKDIR, SpecError, UserError

# What a workspace never holds: version control, environments, caches, earlier runs.
IGNORED = (".git", ".hg", ".svn", ".venv", "venv", "env", "__pycache__", "*.pyc", "*.pyo",
           ".mypy_cache", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", ".tox",
           "node_modules", "runs", ".torchjob", "*.egg-info", ".DS_Store")
# Code, configs and small data: a working directory larger than this holds data that belongs
# in a volume (mounts) rather than in an image layer.
MAX_WORKSPACE_BYTES = 512 * 2**20


@dataclasses.dataclass(frozen=True)
class Workspace:
    """An image to build: ``root`` copied onto ``base`` as ``tag``."""

    root: Path
    base: str
    tag: str
    push: bool  # tag names a registry: pushed after the build

    def as_option(self) -> dict[str, object]:
        return {"root": str(self.root), "base": self.base, "tag": self.tag, "push": self.push}

    @classmethod
    def from_option(cls, raw: Mapping[str, object]) -> Workspace:
        return cls(Path(str(raw["root"])), str(raw["base"]), str(raw["tag"]), bool(raw["push"]))


def is_kit_image(image: str) -> bool:
    """The kit's own image (``localhost/torchjob:latest``, ``REGISTRY/torchjob:TAG``): it holds
    torchjob.trainer and no user code."""
    name = image.rsplit("@", 1)[0]
    repo = name.rsplit(":", 1)[0] if ":" in name.rpartition("/")[2] else name
    return repo.rpartition("/")[2] == "torchjob"


def script_in_workdir(spec: JobSpec, workdir: str, *, kit_image: bool) -> JobSpec:
    """``spec`` for nodes that see the working directory ``workdir`` only as the image's
    WORKDIR (docker's mount of it, an image built from it): a script that is a file under it
    is given relative to it, so ``$PWD/train.py`` works; a SpecError (exit 2, before anything
    starts) for a file of this machine outside it, which the kit's ``image`` cannot hold. With
    an image of your own, a path outside it is the image's."""
    script = spec.trainer.script
    if script is None or not (Path(workdir) / script).is_file():
        return spec  # not on this machine: the image's, or missing there too
    if (relative := _under(Path(workdir), script)) is not None:
        trainer = dataclasses.replace(spec.trainer, script=relative)
        return dataclasses.replace(spec, trainer=trainer)
    if not kit_image:
        return spec
    raise SpecError("trainer.script", f"{script!r} is outside the working directory "
                    f"{os.path.abspath(workdir)}, and the containers get nothing of this "
                    f"machine but that directory (at {IMAGE_WORKDIR}): start torchjob from a "
                    "directory that holds the script (relative paths count from there), or set "
                    "image: an image of your own that holds it at that path")


def _under(root: Path, script: str) -> str | None:
    """``script`` (relative to ``root``, or absolute) as a path relative to ``root``; None
    when it lies outside. The file itself may be a link (its name counts), the folders are
    compared as given and resolved (a working directory reached through a link)."""
    path = Path(os.path.normpath(Path(os.path.abspath(root)) / script))
    for base, found in ((Path(os.path.abspath(root)), path),
                        (root.resolve(), path.parent.resolve() / path.name)):
        if found.is_relative_to(base) and found != base:
            return found.relative_to(base).as_posix()
    return None


def local_code(spec: JobSpec, root: Path) -> Path | None:
    """The job's code as found under ``root``: a relative script, or the top package or module
    of ``trainer.module``; None when it is not there."""
    if spec.trainer.script is not None:
        script = spec.trainer.script
        relative = None if Path(script).is_absolute() else _under(root, script)
        return root / relative if relative is not None and (root / relative).is_file() \
            else None
    top = spec.trainer.module.partition(".")[0]
    for found in (root / f"{top}.py", root / top):
        if found.exists():
            return found
    return None


def _what(spec: JobSpec) -> str:
    return (f"trainer.script {spec.trainer.script!r}" if spec.trainer.script is not None
            else f"trainer.module {spec.trainer.module!r}")


def decide(spec: JobSpec, cwd: str, image_field: str) -> Workspace | None:
    """The image to build for ``spec`` run from ``cwd`` on a backend whose nodes run the image
    named by ``image_field`` (``image``); None when none is needed; a SpecError when the job's
    code could reach no node."""
    if spec.trainer.builtin:
        return None
    image = image_of(spec, image_field)
    root = Path(cwd).resolve()
    code = local_code(spec, root)
    if spec.workspace.ship == "never":
        if code is not None and is_kit_image(image):
            raise SpecError("workspace.ship", f"is never, and {_what(spec)} is here ({code}) "
                            f"but not in {image_field} {image!r} (the kit's image holds "
                            "torchjob.trainer alone): set workspace.ship: auto to build an "
                            "image with this directory, or image: an image of your own that "
                            "holds the code")
        return None
    if code is None:
        if is_kit_image(image) and spec.trainer.script is not None and \
                Path(spec.trainer.script).is_absolute():
            raise SpecError(image_field, f"{image!r} is the kit's image, which holds "
                            f"torchjob.trainer alone, so {_what(spec)} cannot be in it: set "
                            "image: an image of your own that holds it, or give the script "
                            "relative to the working directory to ship that directory")
        if is_kit_image(image):
            raise SpecError(image_field, f"{image!r} is the kit's image, which holds "
                            f"torchjob.trainer alone, and {_what(spec)} is not in {root} to "
                            "be shipped: start torchjob where the code is (relative paths "
                            "count from there), or set image: an image of your own that holds "
                            "it")
        return None  # the job's own image holds it
    digest = hashlib.sha256(image.encode())
    for path, relative in files(root):
        digest.update(f"{relative}\0{path.stat().st_mode & 0o777}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    tag = f"{spec.workspace.repo}:{spec.name}-{digest.hexdigest()[:12]}"
    return Workspace(root, image, tag, is_registry(spec.workspace.repo))


def image_of(spec: JobSpec, field: str) -> str:
    """The image named by ``field`` (``image``, ``SECTION.NAME``)."""
    value: object = spec
    for part in field.split("."):
        value = getattr(value, part)
    return str(value)


def with_image(spec: JobSpec, image_field: str, tag: str) -> JobSpec:
    """``spec`` with the built image where its nodes' image is named."""
    if image_field == "image":
        return dataclasses.replace(spec, image=tag)
    section, _, name = image_field.partition(".")
    return dataclasses.replace(spec, **{section: dataclasses.replace(getattr(spec, section),
                                                                     **{name: tag})})


def files(root: Path) -> Iterator[tuple[Path, str]]:
    """(path, path relative to ``root``) of every file a workspace holds, in a fixed order;
    a SpecError past ``MAX_WORKSPACE_BYTES``."""
    total = 0
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not _ignored(d))
        for name in sorted(names):
            path = Path(folder, name)
            if _ignored(name) or not path.is_file():
                continue
            total += path.stat().st_size
            if total > MAX_WORKSPACE_BYTES:
                raise SpecError("workspace", f"{root} holds more than {MAX_WORKSPACE_BYTES} "
                                "bytes (MAX_WORKSPACE_BYTES) to copy into an image: keep data "
                                "in a volume (mounts) and code here, or set workspace.ship: "
                                "never and image: an image of your own")
            yield path, str(path.relative_to(root))


def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in IGNORED)


def build(workspace: Workspace, err: IO[str]) -> None:
    """Build the workspace image with podman or docker (and push it where it names a
    registry); a UserError naming what failed. The kit's image it builds on is built first
    where it is this machine's and missing or stale (``torchjob.jobs.images``)."""
    engine = shutil.which("podman") or shutil.which("docker")
    if engine is None:
        raise UserError("a script or module job on this backend runs in an image built from "
                        "the working directory, which needs podman or docker here: install "
                        "one, or set workspace.ship: never and image: an image of your own "
                        "that holds the code")
    if is_kit_image(workspace.base):  # missing here, or another trainer's (a registry's: left)
        ensure_image(Path(engine).name, workspace.base, err)
    with tempfile.TemporaryDirectory(prefix="torchjob-workspace-") as tmp:
        context = Path(tmp)
        for path, relative in files(workspace.root):
            target = context / "workspace" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (context / "workspace").mkdir(exist_ok=True)
        (context / "Dockerfile").write_text(
            f"FROM {workspace.base}\n"
            f"COPY --chown={IMAGE_UID}:0 workspace/ {IMAGE_WORKDIR}/\n"
            f"WORKDIR {IMAGE_WORKDIR}\n")
        print(f"torchjob: building {workspace.tag}: {workspace.root} onto {workspace.base}",
              file=err, flush=True)
        _engine([engine, "build", "-t", workspace.tag, str(context)], "building", workspace)
    if workspace.push:
        print(f"torchjob: pushing {workspace.tag}", file=err, flush=True)
        _engine([engine, "push", workspace.tag], "pushing", workspace)


def _engine(argv: list[str], doing: str, workspace: Workspace) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=3600, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise UserError(f"{doing} the workspace image {workspace.tag} failed ({argv[0]} exit "
                        f"{proc.returncode}); nothing was submitted:\n{tail}")

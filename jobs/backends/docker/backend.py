"""The docker backend: one container per node from a compose file (``render.py``), run by
podman-compose or ``docker compose`` (``containers.py``) from a launcher here
(``torchjob.jobs.launcher.LaunchedHere``: ``docker:PROJECT``), always torn down at the end."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import IO

from torchjob.jobs import images, launcher
from torchjob.jobs.backend import Context, Request, no_variant
from torchjob.jobs.backends.docker import containers
from torchjob.jobs.backends.docker.engine import find_engine
from torchjob.jobs.hosts import on_one_host
from torchjob.jobs.backends.docker.render import compose_text, mounts_workdir, render_compose
from torchjob.jobs.runs import Record
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.checks import gpus_asked
from torchjob.jobs.workspace import is_kit_image, script_in_workdir


def invoking_user(spec: JobSpec) -> str | None:
    """The ids the node containers run as (``torchjob.jobs.images.invoking_user``) under the
    engine compose drives."""
    podman = spec.docker.engine == "podman" or (
        spec.docker.engine == "auto" and shutil.which("podman") and shutil.which("podman-compose"))
    return images.invoking_user(rootless=images.rootless("podman" if podman else "docker"))


class DockerBackend(launcher.LaunchedHere):
    name = "docker"  # the run directory is bind-mounted from here (sees_run_dir)

    def fits(self, spec: JobSpec) -> None:
        on_one_host(spec.nnodes.max, "nnodes", "docker")
        gpus_asked(spec.nproc_per_node, spec.resources.gpus, "docker")

    def render(self, spec: JobSpec, context: Context) -> Request:
        if mounts_workdir(spec):  # the containers see the working directory at /workspace
            spec = script_in_workdir(spec, context.workdir, kit_image=is_kit_image(spec.image))
        doc = render_compose(spec, workdir=context.workdir, user=invoking_user(spec))
        return Request(self.name, spec.name, doc, compose_text(doc, source=context.source),
                       spec, context)

    def ready(self, request: Request) -> None:
        find_engine(request.spec.docker.engine)  # a UserError that says how to install one

    def launch(self, request: Request, record: Record) -> launcher.Launch:
        spec, context = request.spec, request.context
        engine = find_engine(spec.docker.engine)

        def body(stops: launcher.Stops, echo: bool, err: IO[str]) -> int:
            return containers.run_docker(spec, engine=engine, cwd=Path(context.workdir),
                                     compose=request.text, project=context.run_id,
                                     record=record, grace=context.grace, stops=stops,
                                     echo=echo, err=err)
        return body


create = no_variant(DockerBackend)  # the torchjob.backends entry point

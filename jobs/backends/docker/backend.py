"""The docker backend: one container per node from a compose file (``render.py``), run by
podman-compose or ``docker compose`` (``launch.py``), always torn down at the end. ``run`` is
the foreground launcher; ``submit`` starts the same launcher detached. Either way the run is
recorded in its run directory (``torchjob.jobs.runs``: the compose file used, each node's log), so
that ``status``, ``logs``, ``cancel`` (as Ctrl-C) and ``list`` work for ``docker:PROJECT``
(the compose project) from any terminal."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from torchjob.jobs import launcher, runs
from torchjob.jobs.backend import GRACE_S, BaseBackend, Context, Handle, Request, no_variant
from torchjob.jobs.backends.docker import launch
from torchjob.jobs.backends.docker.render import compose_text, render_compose
from torchjob.jobs.spec import JobSpec


def invoking_user(spec: JobSpec) -> tuple[str | None, str | None]:
    """The ids the node containers run as: the invoking user's (``UID:GID``), so that a home
    directory only they can read (mode 700) is readable in the containers and what the job
    writes is theirs, with podman in ``keep-id`` user namespace mode (rootless podman: the
    same ids on the host); root keeps the image's own user (uid 1000): (None, None)."""
    if os.getuid() == 0:
        return None, None
    podman = spec.docker.engine == "podman" or (
        spec.docker.engine == "auto" and shutil.which("podman") and shutil.which("podman-compose"))
    return f"{os.getuid()}:{os.getgid()}", "keep-id" if podman else None


class DockerBackend(runs.RecordedRuns, BaseBackend):
    name = "docker"
    sees_run_dir = True  # the run directory is bind-mounted from here

    def check(self, spec: JobSpec) -> None:
        launch.find_engine(spec.docker.engine)  # a UserError that says how to install one

    def render(self, spec: JobSpec, context: Context) -> Request:
        user, userns = invoking_user(spec)
        doc = render_compose(spec, workdir=context.workdir, user=user, userns=userns)
        return Request(self.name, spec.name, doc, compose_text(doc, source=context.source),
                       spec, context)

    def _start(self, request: Request) -> tuple[runs.Record, Callable[..., int]]:
        """The run's record (this process its launcher for now) and the launcher, which
        takes the stop signals' count, ``echo`` and ``err``."""
        spec, context = request.spec, request.context
        assert spec is not None and context is not None
        engine = launch.find_engine(spec.docker.engine)
        cwd = Path(context.workdir)
        record = runs.create(self.name, context.run_id, cwd / spec.run_dir, name=spec.name,
                             request={"text": request.text, "data": request.data,
                                      "context": dataclasses.asdict(context)})

        def start(stops: launcher.Stops, *, echo: bool = True,
                  err: IO[str] | None = None) -> int:
            return launch.run_docker(spec, engine=engine, cwd=cwd, compose=request.text,
                                     project=context.run_id, record=record,
                                     grace=float(context.options.get("grace", GRACE_S)),
                                     stops=stops, echo=echo, err=err)
        return record, start

    def run(self, request: Request) -> int:
        record, start = self._start(request)
        err = launcher.tee(record, sys.stderr)
        try:
            return launcher.perform(record, lambda stops: start(stops, err=err))
        finally:
            err.close()

    def submit(self, request: Request) -> Handle:
        record, start = self._start(request)
        def launch(stops: launcher.Stops) -> int:
            err = launcher.tee(record, None)  # launcher.log and output.log
            try:
                return start(stops, echo=False, err=err)
            finally:
                err.close()

        launcher.detach(record, launch)
        return Handle(self.name, record.path.name)


create = no_variant(DockerBackend)  # the torchjob.backends entry point

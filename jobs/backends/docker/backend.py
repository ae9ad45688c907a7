"""The docker backend: one container per node from a compose file (``render.py``), run by
podman-compose or ``docker compose`` (``launch.py``), always torn down at the end."""

from __future__ import annotations

from pathlib import Path

from jobs.backend import GRACE_S, BackendError, BaseBackend, Context, Handle, Request
from jobs.backends.docker import launch
from jobs.backends.docker.render import compose_text, render_compose
from jobs.spec import JobSpec


class DockerBackend(BaseBackend):
    name = "docker"

    def check(self, spec: JobSpec) -> None:
        launch.find_engine(spec.docker.engine)  # a UserError that says how to install one

    def render(self, spec: JobSpec, context: Context) -> Request:
        doc = render_compose(spec)
        return Request(self.name, spec.name, doc, compose_text(doc, source=context.source),
                       spec, context)

    def run(self, request: Request) -> int:
        spec, context = request.spec, request.context
        assert spec is not None and context is not None
        engine = launch.find_engine(spec.docker.engine)
        return launch.run_docker(spec, engine=engine, cwd=Path(context.workdir),
                                 compose=request.text,
                                 grace=float(context.options.get("grace", GRACE_S)))

    def submit(self, request: Request) -> Handle:
        raise BackendError("docker jobs run in the foreground: use 'torchjob run --to docker "
                           "JOB.yaml'")


def create(variant: str) -> DockerBackend:
    if variant:
        raise BackendError(f"backend 'docker' has no variant {variant!r}")
    return DockerBackend()

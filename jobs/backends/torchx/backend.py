"""The TorchX backend: the job as an AppDef (``render.py``), through any TorchX scheduler
(``torchx:local_cwd``, ``torchx:slurm``, ``torchx:kubernetes``, ...), TorchX's own way:
``render`` is the scheduler's dryrun, ``submit`` schedules exactly that dryrun.
Handles are TorchX's own app handles behind ``torchx:`` (``torchx:local_cwd://torchjob/x``).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from torchx import specs
from torchx.runner import Runner
from torchx.specs import AppStatus

from torchjob.jobs.backend import (BackendError, Backend, Context, Handle, JobStatus, Request,
                                   State)
from torchjob.jobs.backends.torchx import needs, runner
from torchjob.jobs.backends.torchx.local import with_grace
from torchjob.jobs.backends.torchx.render import SLURM_JOB_PORT, appdef_text, render_appdef
from torchjob.jobs.hosts import on_one_host, run_binds
from torchjob.jobs.images import ensure_image, invoking_user, prepare_dirs
from torchjob.jobs.spec import JobSpec, Rdzv
from torchjob.jobs.trainer_args import trainer_argv
from torchjob.jobs.checks import gpus_asked
from torchjob.jobs.values import bad
from torchjob.jobs.workspace import is_kit_image

# Schedulers whose pods the kubelet starts: it expands $(VAR) in their command and env too.
KUBERNETES_SCHEDULERS = ("kubernetes", "kubernetes_mcad")
# Nodes of one job through TorchX's Kubernetes schedulers: they write a whole pod template per
# node into one object (some 2 KB each), and the API server stores at most 1.5 MiB per object.
MAX_TORCHX_POD_NODES = 512

STATES = {"SUCCEEDED": State.SUCCEEDED, "FAILED": State.FAILED, "CANCELLED": State.CANCELLED,
          "RUNNING": State.RUNNING, "PENDING": State.PENDING, "SUBMITTED": State.PENDING,
          "UNSUBMITTED": State.PENDING}


class TorchxBackend(Backend):
    def __init__(self, scheduler: str) -> None:
        self.scheduler = scheduler
        self.name = f"torchx:{scheduler}" if scheduler else "torchx"
        # schedulers whose nodes run this machine's files; local_docker's containers mount
        # the run directory from it (as --to docker does), and run the image
        self.runs_here = scheduler in ("local_cwd", "slurm")
        self.sees_run_dir = self.runs_here or scheduler == "local_docker"
        self._session: runner.Session | None = None  # the runner of a ``torchjob run``

    def image_field(self, spec: JobSpec) -> str | None:
        return None if self.runs_here else "image"

    def _need_scheduler(self) -> str:
        if not self.scheduler:
            raise BackendError("say which TorchX scheduler: --to torchx:local_cwd, "
                               "torchx:slurm, torchx:kubernetes, ...")
        return self.scheduler

    def nodes_python(self, request: Request) -> str | None:
        # local_cwd runs this interpreter (render_appdef); elsewhere the nodes' own python
        return request.context.python if self.scheduler == "local_cwd" else None

    def ready(self, request: Request) -> None:
        if self.scheduler:
            needs.reachable(self.scheduler)

    def fits(self, spec: JobSpec) -> None:
        if self.scheduler in runner.LOCAL_SCHEDULERS:
            on_one_host(spec.nnodes.max, "nnodes", self.name)
        if self.scheduler not in ("", "local_cwd"):  # elsewhere a node has the GPUs asked for
            gpus_asked(spec.nproc_per_node, spec.resources.gpus, f"TorchX's {self.scheduler}")
        if self.scheduler == "slurm":
            _slurm_fits(spec)
        if self.scheduler in KUBERNETES_SCHEDULERS and spec.nnodes.max > MAX_TORCHX_POD_NODES:
            raise bad("nnodes", str(spec.nnodes), f"is more than {MAX_TORCHX_POD_NODES} nodes "
                      "(MAX_TORCHX_POD_NODES): TorchX's Kubernetes scheduler writes a pod "
                      "template per node into one object, which the API server would refuse; "
                      "use --to k8s (one template for all replicas)")

    def render(self, spec: JobSpec, context: Context) -> Request:
        # local_cwd runs here, in this interpreter's environment; elsewhere the image's python
        local_docker = self.scheduler == "local_docker"
        # relative mount sources are this machine's: for schedulers whose nodes see it
        sees = not self.scheduler or self.scheduler in (*runner.LOCAL_SCHEDULERS, "slurm")
        local_cwd = self.scheduler == "local_cwd"
        # local_cwd's nodes are processes of this host, where the spec's port (29400) may be
        # another job's: the run's free port, as --to local takes; on Slurm the default port
        # is the job's own, as --to slurm's (a port the spec gives is kept)
        port: int | str | None = context.port if local_cwd else None
        if self.scheduler == "slurm" and spec.rdzv.port == Rdzv().port:
            port = SLURM_JOB_PORT
        app = render_appdef(spec, python=context.python if local_cwd else "python",
                            kubelet=self.scheduler in KUBERNETES_SCHEDULERS,
                            binds=tuple(run_binds(spec, context.workdir, context.workdir))
                            if local_docker else (), workdir=context.workdir if sees else None,
                            port=port)
        if not self.scheduler:  # the AppDef itself, for any scheduler
            return Request(self.name, spec.name, app, appdef_text(app), spec, context)
        info = runner.dryrun(app, self.scheduler, log_dir=f"{spec.run_dir}/torchx")
        if self.scheduler in KUBERNETES_SCHEDULERS:
            runner.grace_pods(info, spec.stop_grace)
        elif local_docker:  # the run's grace (--grace, else the spec's), as --to docker's
            runner.local_containers(info, math.ceil(context.grace),
                                    invoking_user(rootless=needs.docker_rootless()))
        elif local_cwd:
            with_grace(info, context.grace)
        return Request(self.name, spec.name, info, f"{info}\n", spec, context)

    def submit(self, request: Request) -> Handle:
        self._need_scheduler()
        spec = request.spec
        if self.scheduler == "local_docker":  # as the docker backend does
            if is_kit_image(spec.image) and (engine := needs.docker_engine()) is not None:
                ensure_image(engine, spec.image, sys.stderr)  # (a registry's: left to pull)
            prepare_dirs(spec, Path(request.context.workdir))  # writable by the image's user
        return self.parse_handle(runner.schedule(request.data, self._held()))

    def run(self, request: Request) -> int:
        self._need_scheduler()
        self._session = runner.Session()
        try:
            return super().run(request)
        finally:
            self._session.close()
            self._session = None

    def _held(self) -> Runner | None:
        """The runner of this ``torchjob run`` (None outside one)."""
        return self._session.runner if self._session is not None else None

    def follow(self, handle: Handle, request: Request) -> Iterator[str]:
        assert self._session is not None
        return self._session.follow(handle.id, request.data._app)

    def logs_place(self, handle: Handle, request: Request) -> str:
        log_dir = request.data._cfg.get("log_dir")
        return f"{log_dir}/{handle.id.partition('://')[2]}" if log_dir else super().logs_place(
            handle, request)

    def parse_handle(self, text: str) -> Handle:
        match = re.fullmatch(r"([a-z][a-z0-9_]*)://.*/.+", text)  # TorchX's own form
        if not match:
            raise BackendError(f"{text!r} is not a TorchX app handle: write SCHEDULER://"
                               "SESSION/APP_ID as torchjob submit printed it, e.g. "
                               "torchx:local_cwd://torchjob/digits-x1y2")
        return Handle("torchx", text)  # TorchX's handle names its scheduler itself

    def wait(self, handle: Handle) -> JobStatus:
        if self._session is None:
            return super().wait(handle)
        return self._status(handle, self._session.wait(handle.id))

    def status(self, handle: Handle) -> JobStatus:
        return self._status(handle, runner.status(handle.id, self._held()))

    def _status(self, handle: Handle, found: AppStatus) -> JobStatus:
        state = STATES.get(found.state.name, State.UNKNOWN)
        return JobStatus(handle, state, name=handle.id.rsplit("/", 1)[-1],
                         detail=str(found.msg or ""), raw={"torchx": str(found)})

    def logs(self, handle: Handle, *, follow: bool = False,
             log_dir: str | None = None) -> Iterator[str]:
        return runner.log_lines(handle.id, follow=follow)

    def cancel(self, handle: Handle) -> str:
        runner.cancel(handle.id, self._held())
        return f"cancelled {handle} (its workers checkpoint and exit 143)"

    @property
    def ends_with_run(self) -> bool:
        # local_cwd's nodes are this process's children; local_docker's containers the engine's
        return self.scheduler == "local_cwd" and self._session is not None

    def kill_now(self, handle: Handle) -> str:
        runner.cancel(handle.id, self._held())  # a second cancel kills (torchx.local)
        return f"killing {handle} now"

    def list(self) -> list[JobStatus]:
        out = []
        for item in runner.list_apps(self._need_scheduler()):
            handle = Handle(self.name, item.app_handle)
            out.append(JobStatus(handle, STATES.get(item.state.name, State.UNKNOWN),
                                 name=item.name))
        return out


def _slurm_fits(spec: JobSpec) -> None:
    """What TorchX's Slurm scheduler cannot pass on unchanged: it replaces ``${app_id}`` in
    every argument and variable with the job id (after its macros, with no escape), and
    passes env as one ``srun --export=ALL,NAME=VALUE,...``, which splits at commas."""
    args = spec.trainer.args
    words = [(f"trainer.args[{i}]", w) for i, w in enumerate(trainer_argv(args))] \
        if isinstance(args, tuple) else \
        [(f"trainer.args.{k}", trainer_argv({k: v})[1]) for k, v in args.items()]
    strings = [("run_dir", spec.run_dir), ("checkpoint_dir", spec.checkpoint_dir),
               ("trainer.script", spec.trainer.script or ""), *words,
               *((f"env.{k}", v) for k, v in spec.env.items())]
    for path, text in strings:
        if specs.macros.app_id in text:
            raise bad(path, text, f"contains {specs.macros.app_id}, which TorchX's Slurm "
                      "scheduler replaces with the job id: use --to slurm, or avoid it")
    for name, value in spec.env.items():
        if "," in value:
            raise bad(f"env.{name}", value, "contains ',', which TorchX's Slurm scheduler "
                      "cannot pass (srun --export=ALL,NAME=VALUE,... splits at commas): use "
                      "--to slurm")


def create(variant: str) -> TorchxBackend:
    if variant and not re.fullmatch(r"[a-z][a-z0-9_]*", variant):
        raise BackendError(f"{variant!r} is not a TorchX scheduler name (e.g. local_cwd)")
    return TorchxBackend(variant)

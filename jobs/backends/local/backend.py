"""The local backend: ``torchrun`` agents on this machine (``local.nodes`` of them emulate
several nodes), c10d rendezvous on a free loopback port, run by a launcher here
(``torchjob.jobs.launcher.LaunchedHere``: ``local:RUN_ID``)."""

from __future__ import annotations

import os
from typing import IO, Any

from torchjob.jobs import launcher
from torchjob.jobs.backend import Context, Request, no_variant
from torchjob.jobs.hosts import on_one_host
from torchjob.jobs.backends.local.nodes import run_local
from torchjob.jobs.backends.local.render import LocalPlan, render_local, render_text
from torchjob.jobs.runs import Record
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import UserError
from torchjob.trainer.gpus import report


class LocalBackend(launcher.LaunchedHere):
    name = "local"

    def fits(self, spec: JobSpec) -> None:
        nodes = spec.local_nodes
        on_one_host(nodes, "nnodes" if nodes == spec.nnodes.max else "local.nodes", "local")

    def render(self, spec: JobSpec, context: Context) -> Request:
        plan = render_local(spec, port=context.port, python=context.python,
                            run_id=context.run_id, cpu_count=context.cpu_count)
        return Request(self.name, spec.name, plan, render_text(plan), spec, context)

    def nodes_python(self, request: Request) -> str | None:
        return request.context.python

    def ready(self, request: Request) -> None:
        script = request.spec.trainer.script
        if script is not None and not os.path.isfile(os.path.join(request.context.workdir,
                                                                  script)):
            raise UserError(f"trainer.script {script!r} is not a file (relative paths start "
                            f"at {request.context.workdir}): fix the path in the job spec")
        if request.spec.nproc_per_node == "gpu":
            no_gpu_here(request)

    def record_data(self, request: Request) -> dict[str, Any]:
        plan: LocalPlan = request.data
        return {"commands": [list(command) for command in plan.commands], "env": dict(plan.env),
                "secrets": list(plan.secrets), "script": plan.script,
                "store": None if plan.store is None else list(plan.store)}

    def launch(self, request: Request, record: Record) -> launcher.Launch:
        plan: LocalPlan = request.data
        spec, context = request.spec, request.context
        header = (f"torchjob: {spec.name}: {spec.local_nodes} node(s) x {spec.procs_text}, "
                  f"rendezvous 127.0.0.1:{context.port}"
                  f"{' (its own store process)' if plan.store else ''} id {context.run_id}, "
                  f"run dir {spec.run_dir}")

        def body(stops: launcher.Stops, echo: bool, err: IO[str]) -> int:
            print(header, file=err, flush=True)
            return run_local(plan, stops=stops, grace=context.grace, record=record,
                             echo=echo, err=err)
        return body


def no_gpu_here(request: Request) -> None:
    """``nproc_per_node: gpu`` where torch sees no GPU: a UserError before any node starts
    (counted as each node's agent counts them, by a fresh interpreter: none here touches CUDA,
    and in the nodes' environment, with the spec's CUDA_VISIBLE_DEVICES)."""
    plan: LocalPlan = request.data
    try:
        version, gpu_build, gpus = report(request.context.python, {**os.environ, **plan.env})
    except ValueError as exc:
        raise UserError(f"nproc_per_node: gpu: {exc}") from exc
    if not gpus:
        visible = plan.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        seen = f"torch {version} is built for the CPU alone" if not gpu_build else \
            "torch sees no CUDA GPU on this machine" + (
                "" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible})")
        raise UserError(f"nproc_per_node: gpu starts one process per GPU, but {seen}: give a "
                        "count instead (nproc_per_node: 2, or --nproc-per-node 2)")


create = no_variant(LocalBackend)  # the torchjob.backends entry point

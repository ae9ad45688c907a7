"""The local backend: ``torchrun`` agents on this machine (``local.nodes`` of them emulate
several nodes), c10d rendezvous on a free loopback port. ``run`` is the foreground launcher
(``launch.run_local``): Ctrl-C asks the workers to checkpoint, a second one kills.
``submit`` starts the same launcher detached (its own session, its output in files). Either
way the run is recorded in its run directory (``torchjob.jobs.runs``), so that ``status``, ``logs``,
``cancel`` (as Ctrl-C) and ``list`` work for ``local:RUN_ID`` from any terminal.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from torchjob.jobs import launcher, runs
from torchjob.jobs.backend import GRACE_S, BaseBackend, Context, Handle, Request, no_variant
from torchjob.jobs.backends.local.launch import missing_secrets, run_local
from torchjob.jobs.backends.local.render import LocalPlan, render_local, render_text
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import UserError


def plan_data(plan: LocalPlan) -> dict[str, Any]:
    """The plan as JSON data (what the record keeps of the request)."""
    return {"commands": [list(command) for command in plan.commands], "env": dict(plan.env),
            "secrets": list(plan.secrets), "script": plan.script,
            "store": None if plan.store is None else list(plan.store)}


class LocalBackend(runs.RecordedRuns, BaseBackend):
    name = "local"
    sees_run_dir = True

    def check(self, spec: JobSpec) -> None:
        missing = [ref.env for ref in spec.secrets if ref.env not in os.environ]
        if missing:
            raise UserError(f"secret variable(s) not set: {', '.join(missing)}; local runs "
                            f"read secrets from your environment (export {missing[0]}=... "
                            "first)")
        script = spec.trainer.script
        if script is not None and not os.path.isfile(script):
            raise UserError(f"trainer.script {script!r} is not a file (relative paths start "
                            f"at {os.getcwd()}): fix the path in the job spec")

    def render(self, spec: JobSpec, context: Context) -> Request:
        plan = render_local(spec, port=context.port, python=context.python,
                            run_id=context.run_id, cpu_count=context.cpu_count)
        return Request(self.name, spec.name, plan, render_text(plan), spec, context)

    def _start(self, request: Request) -> tuple[LocalPlan, runs.Record, str, float]:
        """The run's record (this process its launcher for now), the line that announces it,
        the grace period."""
        plan: LocalPlan = request.data
        spec, context = request.spec, request.context
        assert spec is not None and context is not None
        for name in missing_secrets(plan, os.environ):  # checked before; the env may change
            raise UserError(f"secret variable {name} is not set")
        record = runs.create(self.name, context.run_id, Path(context.workdir) / spec.run_dir,
                             name=spec.name, request={
                                 "text": request.text, "data": plan_data(plan),
                                 "context": dataclasses.asdict(context)})
        # the handle is local:RUN_ID ("id" below)
        header = (f"torchjob: {spec.name}: {spec.local_nodes} node(s) x {spec.nproc_per_node} "
                  f"process(es), rendezvous 127.0.0.1:{context.port}"
                  f"{' (its own store process)' if plan.store else ''} id {context.run_id}, "
                  f"run dir {spec.run_dir}")
        return plan, record, header, float(context.options.get("grace", GRACE_S))

    def run(self, request: Request) -> int:
        plan, record, header, grace = self._start(request)
        err = launcher.tee(record, sys.stderr)
        try:
            print(header, file=err, flush=True)
            return launcher.perform(record, lambda stops: run_local(
                plan, stops=stops, grace=grace, record=record, err=err))
        finally:
            err.close()

    def submit(self, request: Request) -> Handle:
        plan, record, header, grace = self._start(request)

        def launch(stops: launcher.Stops) -> int:
            err = launcher.tee(record, None)  # launcher.log and output.log
            try:
                print(header, file=err, flush=True)
                return run_local(plan, stops=stops, grace=grace, record=record, echo=False,
                                 err=err)
            finally:
                err.close()

        launcher.detach(record, launch)
        return Handle(self.name, record.path.name)


create = no_variant(LocalBackend)  # the torchjob.backends entry point

"""The local backend: ``torchrun`` agents on this machine (``local.nodes`` of them emulate
several nodes), c10d rendezvous on a free loopback port. ``run`` is the foreground launcher
(``launch.run_local``): Ctrl-C asks the workers to checkpoint, a second one kills.
"""

from __future__ import annotations

import os
import sys

from jobs.backend import GRACE_S, BackendError, BaseBackend, Context, Handle, Request
from jobs.backends.local.launch import missing_secrets, run_local
from jobs.backends.local.render import LocalPlan, render_local, render_text
from jobs.spec import JobSpec
from jobs.values import UserError


class LocalBackend(BaseBackend):
    name = "local"

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

    def run(self, request: Request) -> int:
        plan: LocalPlan = request.data
        spec, context = request.spec, request.context
        assert spec is not None and context is not None
        for name in missing_secrets(plan, os.environ):  # checked before; the env may change
            raise UserError(f"secret variable {name} is not set")
        print(f"torchjob: {spec.name}: {spec.local_nodes} node(s) x {spec.nproc_per_node} "
              f"process(es), rendezvous 127.0.0.1:{context.port} id {context.run_id}, run dir "
              f"{spec.run_dir}", file=sys.stderr, flush=True)
        grace = float(context.options.get("grace", GRACE_S))
        return run_local(plan, grace=grace)

    def submit(self, request: Request) -> Handle:
        raise BackendError("local jobs run in the foreground: use 'torchjob run JOB.yaml'; "
                           "'torchjob submit --to local' does not exist")


def create(variant: str) -> LocalBackend:
    if variant:
        raise BackendError(f"backend 'local' has no variant {variant!r}")
    return LocalBackend()

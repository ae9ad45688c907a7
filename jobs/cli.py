"""The ``torchjob`` command: generic over the backend registry (``jobs.backend``).

``run | render | submit`` load a spec and hand it to the backend named by ``--to``;
``status | logs | cancel`` take a handle that names its backend (``slurm:1234``); ``list``
asks the backends. No command here knows a backend: what differs lives in the backends.
User mistakes (a bad spec, a bad flag, a missing file, a backend that cannot do something)
print one line on stderr and exit 2 before anything starts; unexpected errors keep their
traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from secrets import token_hex
from typing import Any, NoReturn

from jobs import backend as registry
from jobs.backend import GRACE_S, Backend, Context, JobStatus, Request
from jobs.load import SpecError, load
from jobs.preflight import check_checkpoints
from jobs.spec import JobSpec
from jobs.sweep import parse_sweep, sweep_specs
from jobs.values import UserError
from trainer.contract import EXIT_CONFIG, EXIT_OK

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    try:
        return metadata.version("torchjob")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (for a rendezvous on this machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def context(spec: JobSpec, args: argparse.Namespace, *, fresh: bool) -> Context:
    """Everything a render may depend on besides the spec, decided here at the edge. ``fresh``
    (run, submit): a new run id and a free port; else (render) the spec's own, so that the
    printed text is the same every time."""
    options = {"grace": getattr(args, "grace", GRACE_S)}
    return Context(run_id=f"{spec.name}-{token_hex(3)}" if fresh else spec.name,
                   python=sys.executable, workdir=os.getcwd(),
                   port=free_port() if fresh else spec.rdzv.port,
                   cpu_count=os.cpu_count() or 1, source=args.job, options=options)


def resume_overrides(args: argparse.Namespace) -> list[str]:
    """``--fresh`` and ``--resume=force`` as the spec's ``resume`` field."""
    if getattr(args, "fresh", False) and getattr(args, "resume", None):
        raise UserError("--fresh and --resume=force contradict each other: choose one")
    if getattr(args, "fresh", False):
        return ["resume=fresh"]
    return [f"resume={args.resume}"] if getattr(args, "resume", None) else []


def submission(spec: JobSpec, run_id: str) -> JobSpec:
    """``resume: fresh`` tied to this submission (its run id): the old checkpoints are moved
    aside once, and a restart of the same job (a new attempt, a requeue, a pod or container
    started again) resumes its own."""
    return dataclasses.replace(spec, resume=f"fresh:{run_id}") if spec.resume == "fresh" \
        else spec


def requests(backend: Backend, args: argparse.Namespace, *, fresh: bool) -> list[Request]:
    """The spec rendered for ``backend``: one request, or with ``--sweep`` one for the whole
    array where the backend has arrays, else one per point."""
    spec = load(Path(args.job), [*args.set, *resume_overrides(args)])
    sweep = parse_sweep(getattr(args, "sweep", []))
    def render(spec: JobSpec, **options: Any) -> Request:
        ctx = context(spec, args, fresh=fresh)
        ctx = dataclasses.replace(ctx, options={**ctx.options, **options})
        return backend.render(submission(spec, ctx.run_id) if fresh else spec, ctx)

    if not sweep:
        return [render(spec)]
    points = sweep_specs(spec, sweep)  # checks the sweep on every backend
    if backend.native_sweep:
        return [render(spec, sweep=sweep)]
    return [render(point) for point in points]


def preflight(backend: Backend, spec: JobSpec) -> None:
    """Before anything is submitted: the backend's own check, and where its nodes see this
    machine's run directory, checkpoints of another configuration (jobs.preflight)."""
    backend.check(spec)
    if backend.sees_run_dir:
        check_checkpoints(spec, os.getcwd())


def cmd_render(args: argparse.Namespace) -> int:
    for request in requests(registry.get(args.to), args, fresh=False):
        sys.stdout.write(request.text)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    backend = registry.get(args.to)
    (request,) = requests(backend, args, fresh=True)
    if args.dry_run:
        sys.stdout.write(request.text)
        return EXIT_OK
    assert request.spec is not None
    preflight(backend, request.spec)
    return backend.run(request)


def cmd_submit(args: argparse.Namespace) -> int:
    backend = registry.get(args.to)
    found = requests(backend, args, fresh=True)
    if args.dry_run:
        for request in found:
            sys.stdout.write(request.text)
        return EXIT_OK
    for request in found:
        assert request.spec is not None
        preflight(backend, request.spec)
    for request in found:
        print(backend.submit(request), flush=True)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    backend, handle = registry.parse_handle(args.job_id, args.to)
    status = backend.status(handle)
    if args.json:
        print(json.dumps(status.as_json(), default=str))
    else:
        print(f"{status.handle}: {status.state.value}"
              + (f" (exit code {status.exit_code})" if status.exit_code is not None else ""))
        for line in status.detail.splitlines():
            print(f"  {line}")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    backend, handle = registry.parse_handle(args.job_id, args.to)
    for line in backend.logs(handle, follow=args.follow, log_dir=args.log_dir):
        print(line, flush=args.follow)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    backend, handle = registry.parse_handle(args.job_id, args.to)
    print(backend.cancel(handle))
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    names = args.to or registry.names()
    found: list[JobStatus] = []
    for name in names:
        try:
            found += registry.get(name).list()
        except UserError as exc:  # this backend cannot list here (no cluster, no tool)
            if args.to:
                raise
            print(f"torchjob: {name}: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps([status.as_json() for status in found], default=str))
    else:
        for status in found:
            print(f"{status.handle}\t{status.state.value}\t{status.name}")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    """Check hand-written files for a backend: for Kubernetes (the default), manifests of any
    kind against the upstream CRDs, the operators' admission rules and Pod Security
    "restricted"."""
    backend = registry.get(args.to)
    failed = 0
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as exc:
            raise UserError(f"{name}: cannot read it ({exc.strerror})") from None
        problems = backend.validate(text, strict=not args.no_pod_security)
        for problem in problems:
            print(f"{name}: {problem}", file=sys.stderr)
        print(f"{name}: {'valid' if not problems else f'{len(problems)} problem(s)'}")
        failed += bool(problems)
    return EXIT_CONFIG if failed else EXIT_OK


BACKENDS_HELP = ("local | docker | slurm | slurm:sbatch | torchx | torchx:SCHEDULER | k8s | "
                 "k8s:trainjob")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchjob", description="Run one PyTorch distributed training job "
                     "from one YAML job spec:\non this machine, in containers, on Slurm or on "
                     "Kubernetes.", epilog="examples:\n"
                     "  torchjob run jobs/examples/default.yaml\n"
                     "  torchjob run jobs/examples/default.yaml --set trainer.args.epochs=3\n"
                     "  torchjob render --to slurm jobs/examples/elastic.yaml\n"
                     "  torchjob submit --to slurm jobs/examples/default.yaml   # prints "
                     "slurm:JOB_ID\n"
                     "  torchjob status slurm:JOB_ID\n\n"
                     f"backends: {BACKENDS_HELP}\n"
                     "exit codes: 0 done, 1 the job failed, 2 bad configuration, 143 stopped "
                     "after a checkpoint\n(run again to resume from the last checkpoint)",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"torchjob {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    to_help = f"backend: {BACKENDS_HELP}"

    def spec_command(name: str, help: str, default_to: str | None) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help, description=help)
        cmd.add_argument("job", metavar="JOB.yaml", help="the job spec file")
        cmd.add_argument("--to", default=default_to, required=default_to is None,
                         metavar="BACKEND", help=to_help + (f" (default: {default_to})"
                                                            if default_to else ""))
        cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a spec field, e.g. --set nnodes=1:2 or "
                              "--set trainer.args.epochs=3 (repeatable; value is YAML)")
        cmd.add_argument("--fresh", action="store_true",
                         help="start over: checkpoints already in the checkpoint directory "
                              "are moved aside (never deleted), once; restarts of this job "
                              "resume its own")
        cmd.add_argument("--resume", choices=["force"],
                         help="force: resume the checkpoints even though they were written "
                              "with another configuration")
        return cmd

    def sweep_option(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--sweep", action="append", default=[], metavar="ARG=V1,V2",
                         help="a job per value of a trainer argument (repeatable: the grid "
                              "of all); a job array on Slurm")

    run = spec_command("run", "start the job, follow its logs, exit with its exit code",
                       "local")
    run.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    run.add_argument("--grace", type=float, default=GRACE_S, metavar="SECONDS",
                     help="after Ctrl-C/SIGTERM, how long workers may take to checkpoint "
                          "before they are killed (default: %(default)s)")
    run.set_defaults(func=cmd_run)
    render = spec_command("render", "print exactly what would be run or submitted (pure: "
                          "starts nothing)", "local")
    sweep_option(render)
    render.set_defaults(func=cmd_render)
    submit = spec_command("submit", "submit the job and print its handle (BACKEND:ID)", None)
    submit.add_argument("--dry-run", action="store_true", help="print what would be submitted "
                        "(the same as render)")
    sweep_option(submit)
    submit.set_defaults(func=cmd_submit)
    for name, func, help in (("status", cmd_status, "show a submitted job's state"),
                             ("logs", cmd_logs, "print a job's logs, per node, rank and "
                              "attempt"),
                             ("cancel", cmd_cancel, "cancel a job (it checkpoints and exits "
                              "143)")):
        cmd = sub.add_parser(name, help=help, description=help)
        cmd.add_argument("job_id", metavar="JOB", help="the handle torchjob submit printed "
                         "(BACKEND:ID, e.g. slurm:1234), or an ID with --to")
        cmd.add_argument("--to", metavar="BACKEND", help=to_help + " (when JOB is a bare ID)")
        if name == "status":
            cmd.add_argument("--json", action="store_true", help="print it as JSON")
        if name == "logs":
            cmd.add_argument("-f", "--follow", action="store_true",
                             help="keep printing new lines until the job ends")
            cmd.add_argument("--log-dir", metavar="DIR", help="where the job wrote its logs, "
                             "once its backend has forgotten it (slurm: the run directory or "
                             "RUN_DIR/submitit/JOB_ID)")
        cmd.set_defaults(func=func)
    lister = sub.add_parser("list", help="list jobs (every backend that can list here, or "
                            "those given with --to)", description="list jobs")
    lister.add_argument("--to", action="append", metavar="BACKEND", help=to_help)
    lister.add_argument("--json", action="store_true", help="print them as JSON")
    lister.set_defaults(func=cmd_list)
    check = sub.add_parser("validate", help="check Kubernetes manifests against the upstream "
                           "CRDs, admission rules and Pod Security 'restricted'",
                           description=cmd_validate.__doc__)
    check.add_argument("files", nargs="+", metavar="FILE", help="manifest files ('-': stdin)")
    check.add_argument("--to", default="k8s", metavar="BACKEND",
                       help="whose files these are (default: %(default)s)")
    check.add_argument("--no-pod-security", action="store_true",
                       help="skip the Pod Security 'restricted' rules")
    check.set_defaults(func=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``torchjob`` and ``python -m jobs``; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (SpecError, UserError) as exc:
        print(f"torchjob: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # before anything started (launchers handle their own Ctrl-C)
        return 130
    except BrokenPipeError:  # the reader went away (| head): as other Unix tools, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


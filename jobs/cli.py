"""The ``torchjob`` command: load a job spec, render it for a backend, launch it.

User mistakes (a bad spec, a bad flag, a missing file, a backend this version lacks) print
one line on stderr and exit 2 before anything starts; unexpected errors keep their traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from secrets import token_hex
from typing import NoReturn

from jobs.backends.local.launch import GRACE_SECONDS, find_free_port, missing_secrets, run_local
from jobs.load import SpecError, load
from jobs.backends.local.render import LocalPlan, render_local, render_text
from jobs.spec import JobSpec
from jobs.values import UserError

BACKENDS = ("local", "slurm", "k8s", "k8s:trainjob", "docker", "torchx", "torchx:SCHEDULER")
# What each command can do in this version; the rest exit 2 saying so.
AVAILABLE: dict[str, tuple[str, ...]] = {"run": ("local", "docker"),
                                         "render": ("local", "torchx", "k8s", "slurm",
                                                    "docker"),
                                         "submit": ("torchx", "k8s", "slurm"),
                                         "status": ("torchx", "k8s", "slurm"),
                                         "logs": ("torchx", "k8s", "slurm"),
                                         "cancel": ("torchx", "k8s", "slurm")}


class UsageError(Exception):
    """A command-line mistake: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def backend(text: str) -> str:
    """``--to`` value: a known backend name, or ``torchx:SCHEDULER``."""
    if text in BACKENDS[:-1] or re.fullmatch(r"torchx:[a-z][a-z0-9_]*", text):
        return text
    raise argparse.ArgumentTypeError(f"unknown backend {text!r}; choose from "
                                     f"{', '.join(BACKENDS)}")


def _check_backend(command: str, to: str) -> None:
    if to in AVAILABLE[command]:
        return
    if to == "local" and command not in ("run", "render"):
        raise UsageError(f"local jobs run in the foreground: use 'torchjob run JOB.yaml'; "
                         f"'torchjob {command} --to local' does not exist")
    have = ", ".join(AVAILABLE[command]) or "none yet"
    raise UsageError(f"backend {to!r} is not available for 'torchjob {command}' in this "
                     f"version of torchjob (available: {have})")


def _plan(spec: JobSpec, *, port: int, run_id: str) -> LocalPlan:
    return render_local(spec, port=port, python=sys.executable, run_id=run_id,
                        cpu_count=os.cpu_count() or 1)


def cmd_render(args: argparse.Namespace) -> int:
    _check_backend("render", args.to.partition(":")[0])
    spec = load(Path(args.job), args.set)
    if args.to.startswith("torchx"):
        from jobs.backends.torchx.render import appdef_text, render_appdef
        sys.stdout.write(appdef_text(render_appdef(spec)))
    elif args.to == "slurm":
        from slurm.sbatch import render_sbatch
        try:
            sys.stdout.write(render_sbatch(spec, python=sys.executable, workdir=os.getcwd()))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif args.to == "docker":
        from jobs.backends.docker.render import compose_text, render_compose
        sys.stdout.write(compose_text(render_compose(spec), source=args.job))
    elif args.to.startswith("k8s"):
        from k8s.render import render_manifest
        sys.stdout.write(render_manifest(spec, args.to.partition(":")[2] or "pytorchjob"))
    else:
        sys.stdout.write(render_text(_plan(spec, port=spec.rdzv.port, run_id=spec.name)))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    _check_backend("run", args.to)
    spec = load(Path(args.job), args.set)
    if args.to == "docker":
        return run_docker(spec, args)
    port, run_id = find_free_port(), f"{spec.name}-{token_hex(3)}"
    plan = _plan(spec, port=port, run_id=run_id)
    if args.dry_run:
        sys.stdout.write(render_text(plan))
        for name in missing_secrets(plan, os.environ):
            print(f"torchjob: note: secret variable {name} is not set; run would stop",
                  file=sys.stderr)
        return 0
    print(f"torchjob: {spec.name}: {spec.local_nodes} node(s) x {spec.nproc_per_node} "
          f"process(es), rendezvous 127.0.0.1:{port} id {run_id}, run dir {spec.run_dir}",
          file=sys.stderr, flush=True)
    return run_local(plan, grace=args.grace)


def run_docker(spec: JobSpec, args: argparse.Namespace) -> int:
    """One container per node through docker compose or podman-compose."""
    from jobs.backends.docker import launch as docker_launch, render as compose
    if args.dry_run:
        sys.stdout.write(compose.compose_text(compose.render_compose(spec, host_dir=os.getcwd()),
                                              source=args.job))
        return 0
    engine = docker_launch.find_engine(spec.docker.engine)
    return docker_launch.run_docker(spec, engine=engine, grace=args.grace)


def cmd_submit(args: argparse.Namespace) -> int:
    kind, _, target = args.to.partition(":")
    _check_backend("submit", kind)
    spec = load(Path(args.job), args.set)
    if kind == "slurm":
        return submit_slurm(spec, args)
    if kind == "k8s":
        from k8s.render import render_object
        obj = render_object(spec, target or "pytorchjob")
        if args.dry_run:
            from k8s.pod import manifest_text
            sys.stdout.write(manifest_text(obj))
            return 0
        from k8s.client import Cluster
        ref = Cluster().submit(obj)
        print(f"{ref.namespace}/{ref.name}")
        return 0
    from jobs.backends.torchx import launch as torchx_launch
    from jobs.backends.torchx.render import render_appdef
    if not target:
        raise UsageError("say which TorchX scheduler: --to torchx:local_cwd, torchx:slurm, "
                         "torchx:kubernetes, ...")
    return torchx_launch.submit(render_appdef(spec), target, dry_run=args.dry_run)


def submit_slurm(spec: JobSpec, args: argparse.Namespace) -> int:
    """sbatch through submitit: one job, or a job array for ``--sweep key=v1,v2``."""
    from slurm import submitit_job
    sweep = {}
    for text in args.sweep:
        key, eq, values = text.partition("=")
        if not eq or not values:
            raise UsageError(f"--sweep {text!r}: write trainer_arg=v1,v2,... e.g. lr=1e-3,3e-3")
        sweep[key] = values.split(",")
    if args.dry_run:
        print(yaml_dump({"sbatch (through submitit)": submitit_job.submitit_parameters(spec),
                         "each task runs": submitit_job.trainer_command(spec),
                         "sweep": sweep or None}))
        return 0
    ids = submitit_job.submit_sweep(spec, sweep) if sweep else [submitit_job.submit(spec)]
    print("\n".join(ids))
    return 0


def yaml_dump(data: object) -> str:
    import yaml
    return str(yaml.safe_dump(data, sort_keys=False, width=100))


def slurm_job(args: argparse.Namespace) -> int:
    from slurm import slurm_cli
    if args.command == "status":
        state = slurm_cli.state(args.job_id)
        if not state:
            raise UsageError(f"Slurm's accounting knows no job {args.job_id!r}: check the id "
                             "that torchjob submit printed (sacct -X lists recent jobs)")
        print(f"{args.job_id}: {state}")
    elif args.command == "cancel":
        slurm_cli.cancel(args.job_id)
        print(f"cancelled {args.job_id} (its tasks checkpoint and stop)")
    else:
        from slurm.slurm_logs import job_logs
        folder = args.log_dir or slurm_cli.log_folder_of(args.job_id)
        if folder is None:
            raise UsageError(f"Slurm no longer knows where job {args.job_id} wrote its logs: "
                             "pass --log-dir RUN_DIR/submitit/JOB_ID (submit) or RUN_DIR "
                             "(a rendered sbatch script)")
        logs = job_logs(folder, args.job_id)
        if not logs.lines:
            raise UsageError(f"no logs of job {args.job_id} in {folder}")
        for line in logs.formatted():
            print(line)
        for attempt, rank in sorted(logs.first_failing.items()):
            print(f"attempt {attempt}: first failing rank: {rank}", file=sys.stderr)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check Kubernetes manifests (rendered or hand-written) against the upstream CRDs, the
    operators' admission rules and Pod Security "restricted"."""
    from k8s.validate import validate_text
    failed = 0
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as exc:
            raise UsageError(f"{name}: cannot read it ({exc.strerror})") from None
        problems = validate_text(text, pod_security=not args.no_pod_security)
        for problem in problems:
            print(f"{name}: {problem}", file=sys.stderr)
        print(f"{name}: {'valid' if not problems else f'{len(problems)} problem(s)'}")
        failed += bool(problems)
    return 2 if failed else 0


def cmd_job(args: argparse.Namespace) -> int:
    """status / logs / cancel of a submitted job, by the id submit printed."""
    kind, _, target = args.to.partition(":")
    _check_backend(args.command, kind)
    if kind == "slurm":
        return slurm_job(args)
    if kind == "k8s":
        from k8s.client import Cluster, JobRef
        ref = JobRef.parse(args.job_id, "TrainJob" if target == "trainjob" else "PyTorchJob")
        cluster = Cluster()
        if args.command == "status":
            state, conditions = cluster.status(ref)
            print(f"{ref.namespace}/{ref.name}: {state}")
            for cond in conditions:
                print(f"  {cond.get('type')}={cond.get('status')} {cond.get('reason', '')} "
                      f"{cond.get('message', '')}".rstrip())
        elif args.command == "logs":
            for line in cluster.logs(ref):
                print(line)
        else:
            cluster.cancel(ref)
            print(f"deleted {ref.kind} {ref.namespace}/{ref.name}")
        return 0
    from jobs.backends.torchx import launch as torchx_launch
    action = {"status": torchx_launch.status, "logs": torchx_launch.logs,
              "cancel": torchx_launch.cancel}[args.command]
    return action(args.job_id)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchjob", description="Run one PyTorch distributed training job "
                     "from one YAML job spec:\non this machine, in containers, on Slurm or on "
                     "Kubernetes.", epilog="examples:\n"
                     "  torchjob run jobs/examples/default.yaml\n"
                     "  torchjob run jobs/examples/default.yaml --set trainer.args.epochs=3\n"
                     "  torchjob render --to local jobs/examples/elastic.yaml\n\n"
                     "backends: run --to local|docker; render --to local|docker|slurm|k8s|"
                     "torchx;\nsubmit, status, logs, cancel --to slurm|k8s|torchx:SCHEDULER\n"
                     "exit codes: 0 done, 1 training failed, 2 bad configuration, "
                     "143 stopped\n(run again to resume from the last checkpoint)",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    to_help = f"backend: {', '.join(BACKENDS)}"

    def spec_command(name: str, help: str, default_to: str | None) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help, description=help)
        cmd.add_argument("job", metavar="JOB.yaml", help="the job spec file")
        cmd.add_argument("--to", type=backend, default=default_to, required=default_to is None,
                         metavar="BACKEND", help=to_help + (f" (default: {default_to})"
                                                            if default_to else ""))
        cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a spec field, e.g. --set nnodes=1:2 or "
                              "--set trainer.args.epochs=3 (repeatable; value is YAML)")
        return cmd

    run = spec_command("run", "start the job and wait for it (local: torchrun agents here)",
                       "local")
    run.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    run.add_argument("--grace", type=float, default=GRACE_SECONDS, metavar="SECONDS",
                     help="after Ctrl-C/SIGTERM, how long workers may take to checkpoint "
                          "before they are killed (default: %(default)s)")
    run.set_defaults(func=cmd_run)
    spec_command("render", "print what would be run or submitted (pure: starts nothing)",
                 "local").set_defaults(func=cmd_render)
    submit = spec_command("submit", "submit the job to a cluster and return", None)
    submit.add_argument("--dry-run", action="store_true", help="print what would be submitted")
    submit.add_argument("--sweep", action="append", default=[], metavar="ARG=V1,V2",
                        help="slurm: a job array over trainer argument values (repeatable: "
                             "the grid of all)")
    submit.set_defaults(func=cmd_submit)
    check = sub.add_parser("validate", help="check Kubernetes manifests against the upstream "
                           "CRDs, admission rules and Pod Security 'restricted'",
                           description=cmd_validate.__doc__)
    check.add_argument("files", nargs="+", metavar="FILE", help="manifest files ('-': stdin)")
    check.add_argument("--no-pod-security", action="store_true",
                       help="skip the Pod Security 'restricted' rules")
    check.set_defaults(func=cmd_validate)
    for name, help in (("status", "show a submitted job's state"),
                       ("logs", "print a submitted job's logs"),
                       ("cancel", "cancel a submitted job (it checkpoints and exits 143)")):
        cmd = sub.add_parser(name, help=help, description=help)
        cmd.add_argument("job_id", metavar="JOB_ID", help="the id printed by torchjob submit")
        cmd.add_argument("--to", type=backend, required=True, metavar="BACKEND", help=to_help)
        if name == "logs":
            cmd.add_argument("--log-dir", metavar="DIR", help="slurm: the job's submitit log "
                             "folder (RUN_DIR/submitit/JOB_ID), or the run directory of a "
                             "rendered sbatch script, once Slurm has forgotten the job")
        cmd.set_defaults(func=cmd_job)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``torchjob`` and ``python -m jobs``; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (SpecError, UsageError, UserError) as exc:
        print(f"torchjob: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before anything started (run_local handles its own Ctrl-C)
        return 130
    return code

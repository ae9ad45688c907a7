"""The ``torchjob`` command: generic over the backend registry (``torchjob.jobs.backend``).

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
import re
import shlex
import socket
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from secrets import token_hex
from typing import Any, Callable, NoReturn

import yaml

from torchjob.jobs import backend as registry
from torchjob.jobs import workspace
from torchjob.jobs.backend import GRACE_S, Backend, Context, JobStatus, Request
from torchjob.jobs.hosts import refuse_system_dirs
from torchjob.jobs.load import SpecError, parse_yaml, read_spec, with_overrides
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.sweep import Sweep, parse_sweep, sweep_specs
from torchjob.jobs.values import UserError
from torchjob.trainer.contract import EXIT_CONFIG, EXIT_OK

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
    return Context(run_id=f"{spec.name}-{token_hex(3)}" if fresh else spec.name,
                   python=sys.executable, workdir=os.getcwd(),
                   port=free_port() if fresh else spec.rdzv.port,
                   cpu_count=os.cpu_count() or 1, source=args.source,
                   grace=getattr(args, "grace", GRACE_S))


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


# torchrun's options (and the job's name) as the spec fields they set, before any --set
LAUNCH_OPTIONS = {"nproc_per_node": "--nproc-per-node", "nnodes": "--nnodes",
                  "max_restarts": "--max-restarts", "name": "--name"}


def job_name(target: str) -> str:
    """A job name (a DNS-1035 label) from a script's or module's name: train_gpt.py is
    train-gpt, mypkg.train is train."""
    stem = Path(target).stem if target.endswith(".py") else target.rpartition(".")[2]
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return name if re.match(r"[a-z]", name) else f"job-{name}".strip("-")


def job_data(args: argparse.Namespace) -> Any:
    """The job as data before ``--set``: the spec file's, or one made from the command line
    (``torchjob run [OPTIONS] SCRIPT.py ARGS...``, as torchrun takes it: every word after the
    script is the script's own)."""
    if not args.script:
        return parse_yaml(read_spec(Path(args.target)), args.target)
    trainer: dict[str, Any] = {"module": args.target} if args.module else \
        {"script": args.target}
    if args.rest:
        trainer["args"] = list(args.rest)
    return {"name": job_name(args.target), "trainer": trainer}


def job_spec(args: argparse.Namespace) -> JobSpec:
    """The job this command runs: spec file or command line, then torchrun's options, then
    ``--set``; with ``--save-spec FILE`` written there as YAML (``torchjob run FILE`` runs it
    again)."""
    launch = [(f"{dest}={getattr(args, dest)}", option) for dest, option in
              LAUNCH_OPTIONS.items() if getattr(args, dest) is not None]
    data, spec = with_overrides(job_data(args), [*launch, *args.set, *resume_overrides(args)],
                                source=args.source)
    if args.save_spec:
        save_spec(Path(args.save_spec), data, args)
    return spec


def save_spec(path: Path, data: Any, args: argparse.Namespace) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file renamed over it)."""
    text = (f"# Written by torchjob {args.command} --save-spec: torchjob run {path.name} runs "
            "this job again.\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True,
                                                  width=100))
    if path.is_dir():
        raise UserError(f"--save-spec {path}: is a directory; name a file, e.g. {path}/job.yaml")
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"--save-spec {path}: cannot write it ({exc.strerror or exc}); name a "
                        "file in a directory you can write") from None


def finish_target(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """What TARGET is: a script (``*.py``) or, with ``-m``, a module, whose arguments are every
    word after it, as torchrun takes them; else a job spec file, after which options may
    still come (``torchjob run job.yaml --set epochs=3``)."""
    args.script = bool(args.module) or args.target.endswith(".py")
    # where the job came from, as renderings name it (Regenerate with: torchjob render SOURCE):
    # the command line without the options that are not part of the job
    words = list(argv[1:])
    at = words.index(args.target) if args.target in words else len(words)
    kept: list[str] = []
    for i, word in enumerate(words[:at]):
        if word in ("--to", "--save-spec") or word.startswith(("--to=", "--save-spec=")) or \
                (i and words[i - 1] in ("--to", "--save-spec")):
            continue
        kept.append(word)
    args.source = shlex.join([*kept, *words[at:]]) if args.script else args.target
    if args.script or not args.rest:
        return
    target = args.target
    # the options after the spec file, parsed into the same namespace; one given before it
    # (--to of submit) counts as given
    given = [a for a in args.parser._actions if a.required and a.option_strings]
    for action in given:
        action.required = False
    try:
        args.parser.parse_args([*args.rest, target], namespace=args)
    finally:
        for action in given:
            action.required = True
    if args.target != target or args.rest:
        words = [w for w in (args.target, *args.rest) if w != target]
        raise UserError(f"{' '.join(words)!r} after {target}: a job spec takes no arguments; "
                        "set trainer arguments with --set trainer.args.NAME=VALUE, or run a "
                        "script as torchjob run [OPTIONS] SCRIPT.py [ARGS...]")


def requests(backend: Backend, args: argparse.Namespace, *, fresh: bool) -> list[Request]:
    """The spec rendered for ``backend``: one request, or with ``--sweep`` one for the whole
    array where the backend has arrays, else one per point."""
    spec = job_spec(args)
    backend.fits(spec)
    if backend.sees_run_dir:  # its nodes write where this machine does: relative paths from here
        refuse_system_dirs(spec, workdir=os.getcwd())
    shipped = None
    if (field := backend.image_field(spec)) is not None:  # the code reaches them in an image
        found = workspace.decide(spec, os.getcwd(), field)
        if found is not None:
            spec = workspace.with_image(spec, field, found.tag)
            shipped = found.as_option()
    sweep = parse_sweep(getattr(args, "sweep", []))

    def render(spec: JobSpec, sweep: Sweep | None = None) -> Request:
        ctx = dataclasses.replace(context(spec, args, fresh=fresh), workspace=shipped,
                                  sweep=sweep)
        return backend.render(submission(spec, ctx.run_id) if fresh else spec, ctx)

    if not sweep:
        return [render(spec)]
    points = sweep_specs(spec, sweep)  # checks the sweep on every backend
    if backend.native_sweep:
        return [render(spec, sweep=sweep)]
    return [render(point) for point in points]


def ship(request: Request) -> None:
    """Build (and push) the workspace image the request runs, before it is submitted
    (torchjob.jobs.workspace)."""
    raw = request.context.workspace
    if raw:
        workspace.build(workspace.Workspace.from_option(raw), sys.stderr)


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
    backend.preflight(request)
    ship(request)
    return backend.run(request)


def cmd_submit(args: argparse.Namespace) -> int:
    backend = registry.get(args.to)
    found = requests(backend, args, fresh=True)
    if args.dry_run:
        for request in found:
            sys.stdout.write(request.text)
        return EXIT_OK
    for request in found:
        backend.preflight(request)
    ship(found[0])  # one workspace image for the whole sweep
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


def of_rank(rank: int | None) -> Callable[[str], bool]:
    """Which lines ``--rank`` keeps: a worker's, by the log prefix every backend's lines carry
    (``[node I rank R attempt A]``, also after a backend's own prefix such as TorchX's)."""
    if rank is None:
        return lambda line: True
    pattern = re.compile(rf"(^|\s)\[node \d+ rank {rank} attempt \d+\] ")
    return lambda line: bool(pattern.search(line[:200]))


def cmd_logs(args: argparse.Namespace) -> int:
    backend, handle = registry.parse_handle(args.job_id, args.to)
    if args.tail is not None and args.tail < 0:
        raise UserError(f"--tail {args.tail}: give a number of lines, 0 or more")
    keep = of_rank(args.rank)
    skip = 0
    if args.tail is not None:  # the last N lines so far; then, following, the new ones
        history = [line for line in backend.logs(handle, log_dir=args.log_dir)]
        for line in [line for line in history if keep(line)][-args.tail:] if args.tail else []:
            print(line, flush=args.follow)
        if not args.follow:
            return EXIT_OK
        skip = len(history)
    for i, line in enumerate(backend.logs(handle, follow=args.follow, log_dir=args.log_dir)):
        if i >= skip and keep(line):
            print(line, flush=args.follow)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    backend, handle = registry.parse_handle(args.job_id, args.to)
    print(backend.cancel(handle))
    return EXIT_OK


def age(created: float | None, now: float) -> str:
    """``45s``, ``12m``, ``3h``, ``2d`` (as kubectl shows ages); ``-`` when unknown."""
    if created is None:
        return "-"
    seconds = max(0, int(now - created))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def cmd_list(args: argparse.Namespace) -> int:
    names = args.to or registry.names()
    found: list[JobStatus] = []
    for name in names:
        try:
            found += registry.get(name).list()
        except UserError as exc:  # this backend cannot list here (no cluster, no tool)
            if args.to:
                raise
            if args.verbose:
                print(f"torchjob: {name}: not listed: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps([status.as_json() for status in found], default=str))
        return EXIT_OK
    now = time.time()
    rows = [("JOB", "STATE", "NAME", "AGE", "RUN DIR")] + [
        (str(s.handle), s.state.value + (f" ({s.exit_code})" if s.exit_code is not None
                                         else ""), s.name, age(s.created, now), s.run_dir or "-")
        for s in sorted(found, key=lambda s: -(s.created or 0))]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])
    return EXIT_OK


def spec_problems(text: str, name: str, to: str | None) -> list[str] | None:
    """A job spec's problems (none: valid), or None when ``text`` is not a job spec (a
    Kubernetes manifest has apiVersion and kind). With ``to``, also what that backend refuses
    when it renders the job."""
    try:
        data = parse_yaml(text, name)
    except SpecError:
        return None  # not one YAML document: a manifest stream, or for the validator to say
    if not isinstance(data, dict) or {"apiVersion", "kind"} & set(data):
        return None
    try:
        spec = with_overrides(data, source=name)[1]
        if to is not None:
            backend = registry.get(to)
            backend.fits(spec)
            backend.render(spec, Context(run_id=spec.name, python=sys.executable,
                                         workdir=os.getcwd(), port=spec.rdzv.port,
                                         cpu_count=os.cpu_count() or 1, source=name))
    except (SpecError, UserError) as exc:
        return [str(exc)]
    return []


def cmd_validate(args: argparse.Namespace) -> int:
    """Check files without running anything: a job spec (loaded, and with --to rendered for
    that backend), or for Kubernetes (the default) manifests of any kind against the upstream
    CRDs, the operators' admission rules and Pod Security "restricted"."""
    failed = 0
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as exc:
            raise UserError(f"{name}: cannot read it ({exc.strerror})") from None
        found = spec_problems(text, name, args.to)
        if found is not None:
            for problem in found:
                print(problem if problem.startswith(f"{name}:") else f"{name}: {problem}",
                      file=sys.stderr)
            print(f"{name}: {'valid job spec' if not found else 'not a valid job spec'}")
            failed += bool(found)
            continue
        backend = registry.get(args.to or "k8s")
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
                     "  torchjob run --nproc-per-node 2 train.py --lr 0.1   # no YAML needed\n"
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
        cmd = sub.add_parser(name, help=help, description=help,
                             usage=f"torchjob {name} [OPTIONS] JOB.yaml [OPTIONS]\n"
                                   f"       torchjob {name} [OPTIONS] SCRIPT.py [ARGS...]\n"
                                   f"       torchjob {name} [OPTIONS] -m MODULE [ARGS...]")
        cmd.add_argument("target", metavar="JOB.yaml | SCRIPT.py",
                         help="a job spec file, or a training script (or with -m a module) "
                              "that every worker runs, as torchrun does")
        cmd.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARGS",
                         help="after a script or module: its own arguments, exactly as given")
        cmd.add_argument("-m", "--module", action="store_true",
                         help="TARGET is a Python module, run as python -m MODULE (torchrun -m)")
        cmd.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                         metavar="N", help="worker processes per node (spec: nproc_per_node)")
        cmd.add_argument("--nnodes", metavar="N|MIN:MAX",
                         help="nodes, or a range for an elastic job (spec: nnodes)")
        cmd.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", metavar="N",
                         help="restarts of the worker group (spec: max_restarts)")
        cmd.add_argument("--name", help="the job's name (spec: name; default: the script's)")
        cmd.add_argument("--standalone", action="store_true",
                         help="accepted as torchrun takes it: a one-node job always has its "
                              "own rendezvous")
        cmd.add_argument("--save-spec", metavar="FILE",
                         help="write the job spec this command runs to FILE (YAML; "
                              "torchjob run FILE runs it again)")
        cmd.set_defaults(parser=cmd)
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
            cmd.add_argument("--rank", type=int, metavar="R",
                             help="only the lines of global rank R")
            cmd.add_argument("--tail", type=int, metavar="N",
                             help="only the last N lines (with -f: then the new ones)")
            cmd.add_argument("--log-dir", metavar="DIR", help="where the job wrote its logs, "
                             "once its backend has forgotten it (slurm: the run directory or "
                             "RUN_DIR/submitit/JOB_ID)")
        cmd.set_defaults(func=func)
    lister = sub.add_parser("list", help="list jobs (every backend that can list here, or "
                            "those given with --to)", description="list jobs")
    lister.add_argument("--to", action="append", metavar="BACKEND", help=to_help)
    lister.add_argument("--json", action="store_true", help="print them as JSON")
    lister.add_argument("-v", "--verbose", action="store_true",
                        help="also say why a backend that is not set up here was not listed")
    lister.set_defaults(func=cmd_list)
    check = sub.add_parser("validate", help="check job specs, and Kubernetes manifests against "
                           "the upstream CRDs, admission rules and Pod Security 'restricted'",
                           description=cmd_validate.__doc__)
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="job specs or manifest files ('-': stdin)")
    check.add_argument("--to", metavar="BACKEND",
                       help="a job spec: also render it for this backend; manifests: whose "
                            "files these are (default: k8s)")
    check.add_argument("--no-pod-security", action="store_true",
                       help="skip the Pod Security 'restricted' rules")
    check.set_defaults(func=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``torchjob`` and ``python -m torchjob.jobs``; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if hasattr(args, "target"):
            finish_target(args, sys.argv[1:] if argv is None else argv)
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


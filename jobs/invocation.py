"""What one ``torchjob run|render|submit`` command line asks for: the job (a spec file, or a
script or module and its arguments, as torchrun takes them), its context, the backend's
requests, and the workspace image they run."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import random
import re
import shlex
import socket
import sys
import tempfile
import time
import unicodedata
from collections.abc import Container, Iterator, Sequence
from pathlib import Path
from secrets import token_hex
from typing import Any

import yaml

from torchjob.jobs import timeouts, workspace
from torchjob.jobs.backend import Backend, Context, Request
from torchjob.jobs.hosts import refuse_system_dirs
from torchjob.jobs.load import parse_yaml, read_spec, with_overrides
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.sweep import Sweep, parse_sweep, sweep_specs
from torchjob.jobs.values import SpecError, UserError
from torchjob.trainer.env import SLURM_PORTS


# Where a rendezvous on this machine is served: below the kernel's ephemeral range, from which
# any outgoing connection or listener on port 0 (srun's message sockets, say) may be given the
# port between this pick and the store's bind (which then fails, and torch's agent falls back to
# being a client of whatever holds it); and below the Slurm backend's store ports (job.sh).
LOW_PORTS = range(2000, SLURM_PORTS.start)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


# The ports torchjob commands on this machine picked lately. A pick is bound seconds later
# (by an agent, after its import of torch), and until then another command's pick (two runs at
# once) finds it free too: each one is kept from the others' for RESERVE_S.
PICKS = Path(tempfile.gettempdir()) / "torchjob-port-picks"
RESERVE_S = 120.0


def free_port(host: str = "127.0.0.1", taken: Container[int] = ()) -> int:
    """A TCP port free right now, not in ``taken`` nor picked by another torchjob command in
    the last RESERVE_S (for a rendezvous on this machine): one of ``LOW_PORTS`` below the
    ephemeral range, else (none free there) one the kernel picks."""
    try:
        ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    low = range(LOW_PORTS.start, min(LOW_PORTS.stop, ephemeral))
    with _recent_picks() as recent:
        for port in random.sample(low, len(low)):
            if port in taken or port in recent:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            break
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
        recent[port] = time.time()
        return port


@contextlib.contextmanager
def _recent_picks() -> Iterator[dict[int, float]]:
    """PICKS as {port: when}, younger than RESERVE_S, under an exclusive lock; written back.
    Where the file cannot be had (another user's, a read-only /tmp), an empty one."""
    try:
        fd = os.open(PICKS, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError:
        yield {}
        return
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o666)  # every user's commands share it (/tmp is sticky)
        now, recent = time.time(), {}
        for line in f.read(1 << 20).splitlines():
            words = line.split()
            if len(words) == 2 and words[0].isdigit():
                with contextlib.suppress(ValueError):
                    if now - RESERVE_S < float(words[1]) <= now:
                        recent[int(words[0])] = float(words[1])
        yield recent
        f.seek(0)
        f.truncate()
        f.write("".join(f"{port} {when:.3f}\n" for port, when in recent.items()))


def context(spec: JobSpec, *, fresh: bool, source: str | None,
            grace: float | None = None) -> Context:
    """Everything a render may depend on besides the spec, decided here at the edge. ``fresh``
    (run, submit): a new run id and a free port; else (render) the spec's own, so that the
    printed text is the same every time."""
    return Context(run_id=f"{spec.name}-{token_hex(3)}" if fresh else spec.name,
                   python=sys.executable, workdir=os.getcwd(),
                   port=free_port() if fresh else spec.rdzv.port,
                   cpu_count=os.cpu_count() or 1, source=source,
                   grace=job_timeouts(spec, grace).stop_grace.seconds)


def job_timeouts(spec: JobSpec, grace: float | None = None) -> timeouts.Timeouts:
    """The job's timeouts (torchjob.jobs.timeouts), with ``--grace`` where the command has it
    and it was given: checked against the same rules as the spec's ``stop_grace``."""
    found = timeouts.resolve(spec, grace=grace)
    timeouts.check(found)
    return found


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


SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def is_script(target: str) -> bool:
    """Whether TARGET is a script, as torchrun runs any file of Python: ``*.py``; else a file
    not named as a spec (``SPEC_SUFFIXES``) that YAML reads as no more than a string (a
    script's lines are one) or not at all, and that is Python (a python ``#!`` line, or it
    compiles). Anything else is taken for a spec file, whose errors say what is wrong."""
    if target.endswith(".py"):
        return True
    if target.lower().endswith(SPEC_SUFFIXES):
        return False
    try:  # a regular file within a spec's size limit, in UTF-8; else a spec's error says so
        text = read_spec(Path(target))
    except SpecError:
        return False
    try:
        if not isinstance(parse_yaml(text, target), str):  # a mapping, a list, a number, empty
            return False
    except SpecError:
        pass  # not YAML: Python, perhaps
    if re.match(r"#!.*python", text):
        return True
    try:
        compile(text, target, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested past the parser
        return False
    return True


def not_python(target: str) -> None:
    """A UserError for an executable of another language (a ``#!`` line that is not Python's)
    given where a spec or a Python script goes: neither would read it."""
    if target.lower().endswith(SPEC_SUFFIXES):
        return
    try:
        first = read_spec(Path(target)).partition("\n")[0]
    except SpecError:
        return  # not a readable file: the spec's error says what is wrong
    if first.startswith("#!") and "python" not in first:
        raise UserError(f"{target}: a program for {first[2:].strip() or 'its #! line'}, not "
                        "Python: torchjob runs a job spec (JOB.yaml) or a Python script "
                        "(SCRIPT.py, or -m MODULE), as torchrun does without --no-python; run "
                        "the Python command the program starts, with its arguments")


def job_name(target: str, module: bool = False) -> str:
    """A job name (a DNS-1035 label) from a script's or module's name: train_gpt.py is
    train-gpt, mypkg.train is train."""
    stem = target.rpartition(".")[2] if module else Path(target).stem
    stem = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode()  # ü: u
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
    return {"name": job_name(args.target, module=args.module), "trainer": trainer}


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
    args.script = bool(args.module) or is_script(args.target)
    if not args.script:
        not_python(args.target)
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
    read_spec(Path(target))  # a missing spec file says so before the words after it are judged
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
    """The command line's job rendered for ``backend`` (``plan``)."""
    return plan(backend, job_spec(args), fresh=fresh, source=args.source,
                grace=getattr(args, "grace", None), sweep=getattr(args, "sweep", []))


def plan(backend: Backend, spec: JobSpec, *, fresh: bool, source: str | None,
         grace: float | None = None, sweep: Sequence[str] = ()) -> list[Request]:
    """``spec`` rendered for ``backend`` after its ``fits``: one request, or with a sweep
    (``ARG=V1,V2``) one for the whole array where the backend has arrays, else one per point.
    ``fresh`` (run, submit): a new run id and port (``context``)."""
    backend.fits(spec)
    if backend.sees_run_dir:  # its nodes write where this machine does: relative paths from here
        refuse_system_dirs(spec, workdir=os.getcwd())
    shipped = None
    if (field := backend.image_field(spec)) is not None:  # the code reaches them in an image
        kit = workspace.is_kit_image(workspace.image_of(spec, field))
        spec = workspace.script_in_workdir(spec, os.getcwd(), kit_image=kit)
        found = workspace.decide(spec, os.getcwd(), field)
        if found is not None:
            spec = workspace.with_image(spec, field, found.tag)
            shipped = found.as_option()
    grid = parse_sweep(list(sweep))

    def render(spec: JobSpec, sweep: Sweep | None = None) -> Request:
        ctx = dataclasses.replace(context(spec, fresh=fresh, source=source, grace=grace),
                                  workspace=shipped, sweep=sweep)
        return backend.render(submission(spec, ctx.run_id) if fresh else spec, ctx)

    if not grid:
        return [render(spec)]
    points = sweep_specs(spec, grid)  # checks the sweep on every backend
    if backend.native_sweep:
        return [render(spec, sweep=grid)]
    return [render(point) for point in points]


def ship(request: Request) -> None:
    """Build (and push) the workspace image the request runs, before it is submitted
    (torchjob.jobs.workspace)."""
    raw = request.context.workspace
    if raw:
        workspace.build(workspace.Workspace.from_option(raw), sys.stderr)

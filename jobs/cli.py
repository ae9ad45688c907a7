"""The ``torchjob`` command: generic over the backend registry (``torchjob.jobs.backend``); no
command here knows a backend. User mistakes print one line on stderr and exit 2 before
anything starts; unexpected errors keep their traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from torchjob.jobs import api, report, timeouts
from torchjob.jobs import backend as registry
from torchjob.jobs.backend import BackendError, Context, JobStatus, Request
from torchjob.jobs.invocation import finish_target, job_timeouts, requests
from torchjob.jobs.load import SpecError, parse_yaml, with_overrides
from torchjob.jobs.parser import build_parser
from torchjob.jobs.progress import Progress
from torchjob.jobs.values import UserError
from torchjob.trainer.contract import EXIT_CONFIG, EXIT_OK

WATCH_S = 2.0  # status --watch's refresh


def show(found: list[Request], args: argparse.Namespace) -> int:
    """Print the requests exactly (stdout), then the job's timeouts as resolved and checked
    (stderr: what is sent stays what stdout shows); once for a sweep's alike points."""
    for request in found:
        sys.stdout.write(request.text)
    sys.stdout.flush()
    grace = getattr(args, "grace", None)
    tables = dict.fromkeys(timeouts.table(job_timeouts(r.spec, grace)) for r in found)
    sys.stderr.write("".join(tables))
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    return show(requests(registry.get(args.to), args, fresh=False), args)


def cmd_run(args: argparse.Namespace) -> int:
    backend = registry.get(args.to)
    (request,) = requests(backend, args, fresh=True)
    if args.dry_run:
        return show([request], args)
    return api.started(backend, request)


def cmd_submit(args: argparse.Namespace) -> int:
    backend = registry.get(args.to)
    found = requests(backend, args, fresh=True)
    if args.dry_run:
        return show(found, args)
    for handle in api.submitted(backend, found):
        print(handle, flush=True)
    return EXIT_OK


def status_lines(status: JobStatus, now: float) -> list[str]:
    """``torchjob status``'s words: the state, then the backend's detail and the progress."""
    head = f"{status.handle}: {status.state.value}" + (
        f" (exit code {status.exit_code})" if status.exit_code is not None else "")
    told = status.progress.lines(now) if status.progress else []
    return [head] + [f"  {line}" for line in status.detail.splitlines() + told]


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch:
        return watch(args)
    status = api.status(args.job_id, to=args.to)
    if args.json:
        print(json.dumps(status.as_json(), default=str))
    else:
        print("\n".join(status_lines(status, time.time())))
    return EXIT_OK


def watch(args: argparse.Namespace) -> int:
    """``status --watch``: on a terminal, the status redrawn in place every ``WATCH_S``; else
    (a pipe, a file) each change once (a JSON line each with ``--json``); until the job ends."""
    terminal, shown, last = sys.stdout.isatty(), 0, ""
    while True:
        status = api.status(args.job_id, to=args.to)
        if args.json:
            text = json.dumps(status.as_json(), default=str)
        else:
            text = "\n".join(status_lines(status, time.time()))
        told = status.progress or Progress()
        # what a change is, off a terminal
        key = repr((status.state, status.exit_code, status.detail, told.step, told.eval,
                    told.restarts, told.culprit, [(task, t.step, t.eval, t.restarts)
                                                  for task, t in told.tasks.items()]))
        if terminal:  # up to the first line drawn, clear below, draw again
            sys.stdout.write((f"\x1b[{shown}F\x1b[J" if shown else "") + text + "\n")
            shown = text.count("\n") + 1
        elif key != last:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()
        last = key
        if status.state.terminal:
            return EXIT_OK
        time.sleep(WATCH_S)


def cmd_logs(args: argparse.Namespace) -> int:
    for line in api.logs(args.job_id, rank=args.rank, tail=args.tail, follow=args.follow,
                         log_dir=args.log_dir, to=args.to):
        print(line, flush=args.follow)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    print(api.cancel(args.job_id, to=args.to))
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
    def skipped(name: str, exc: UserError) -> None:
        if args.verbose:
            print(f"torchjob: {name}: not listed: {exc}", file=sys.stderr)
    found = api.runs(args.to, skipped=skipped)
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


def spec_problems(text: str, name: str, to: str | None) -> tuple[list[str], str] | None:
    """A job spec's problems (none: valid) and the verdict, or None when ``text`` is not a job
    spec (a Kubernetes manifest has apiVersion and kind). With ``to``, also what that backend
    refuses when it renders the job; a backend that cannot render here (a scheduler's missing
    package or setting) leaves the spec valid, its rendering unchecked."""
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
    except BackendError as exc:
        return [str(exc)], f"a valid job spec, not checked against {to}, which cannot " \
            "render it here (above)"
    except (SpecError, UserError) as exc:
        return [str(exc)], "not a valid job spec"
    return [], "valid job spec"


def cmd_validate(args: argparse.Namespace) -> int:
    """Check files without running anything: a job spec (loaded, and with --to rendered for
    that backend), or for Kubernetes (the default) manifests of any kind against the upstream
    CRDs, the operators' admission rules and Pod Security "restricted"."""
    failed = 0
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_bytes().decode()
        except OSError as exc:
            raise UserError(f"{name}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise UserError(f"{name}: is not UTF-8 text (a job spec or a Kubernetes manifest "
                            "is YAML text)") from None
        found = spec_problems(text, name, args.to)
        if found is not None:
            for problem in found[0]:
                print(problem if problem.startswith(f"{name}:") else f"{name}: {problem}",
                      file=sys.stderr)
            print(f"{name}: {found[1]}")
            failed += bool(found[0])
            continue
        backend = registry.get(args.to or "k8s")
        problems = backend.validate(text, strict=not args.no_pod_security)
        for problem in problems:
            print(f"{name}: {problem}", file=sys.stderr)
        print(f"{name}: {'valid' if not problems else f'{len(problems)} problem(s)'}")
        failed += bool(problems)
    return EXIT_CONFIG if failed else EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """The run's report (torchjob.jobs.report), from its run directory or its handle."""
    run_dir = Path(args.run)
    if not run_dir.exists() and ":" in args.run:  # BACKEND:ID: where its backend says it ran
        run_dir = Path(api.status(args.run).run_dir or args.run)
    print(report.write(run_dir, Path(args.output) if args.output else None))
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run, "render": cmd_render, "submit": cmd_submit, "status": cmd_status,
    "logs": cmd_logs, "cancel": cmd_cancel, "list": cmd_list, "validate": cmd_validate,
    "report": cmd_report}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``torchjob`` and ``python -m torchjob.jobs``; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        os.getcwd()
    except FileNotFoundError:  # removed while the shell was in it: every path is relative to it
        print("torchjob: the current directory no longer exists (it was removed while this "
              "shell was in it): cd into a directory and run again", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if hasattr(args, "target"):
            finish_target(args, sys.argv[1:] if argv is None else argv)
        code: int = COMMANDS[args.command](args)
    except (SpecError, UserError) as exc:
        print(f"torchjob: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # before anything started (launchers handle their own Ctrl-C)
        return 130
    except BrokenPipeError:  # the reader went away (| head): as other Unix tools, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code

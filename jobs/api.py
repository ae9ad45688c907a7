"""The Python API: what the ``torchjob`` commands do, as functions (``torchjob.jobs.cli`` is a
thin layer over them), with the same semantics and errors: a user's mistake raises a
``UserError`` (a ``SpecError`` for the spec, a ``BackendError`` for a backend), which the
command line prints as one line and exit 2. Core: imports no backend."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from torchjob.jobs import backend as registry
from torchjob.jobs.backend import WAIT_POLL_S, Backend, Handle, JobStatus, Request, State
from torchjob.jobs.invocation import plan, ship
from torchjob.jobs.load import SpecError, parse_yaml, read_spec, with_overrides
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import UserError

__all__ = ["load", "render", "submit", "submit_sweep", "run", "status", "logs", "cancel",
           "wait", "runs", "Handle", "JobStatus", "State", "JobSpec", "UserError", "SpecError"]

HandleLike = Handle | str  # a Handle, or its text as submit printed it: "local:RUN_ID"


def load(path: str | os.PathLike[str], overrides: Iterable[str] = (), *,
         to: str | None = None) -> JobSpec:
    """The job spec in the file ``path`` with ``key=value`` overrides (``--set``: the value is
    YAML); with ``to``, also what that backend refuses (its ``fits``)."""
    if isinstance(overrides, str):
        raise TypeError(f"overrides={overrides!r}: give a list of 'key=value' strings")
    where = os.fspath(path)
    spec = with_overrides(parse_yaml(read_spec(Path(where)), where), list(overrides),
                          source=where)[1]
    if to is not None:
        registry.get(to).fits(spec)
    return spec


def render(spec: JobSpec, to: str = "local", *, sweep: Sequence[str] = (),
           source: str | None = None) -> str:
    """Exactly what ``submit`` would send, as ``torchjob render`` prints it (pure)."""
    backend = registry.get(to)
    return "".join(r.text for r in plan(backend, spec, fresh=False, source=source, sweep=sweep))


def submitted(backend: Backend, found: Sequence[Request]) -> Iterator[Handle]:
    """Each request's handle as it is submitted, after every request's preflight and the
    workspace image built once (``torchjob submit``)."""
    for request in found:
        backend.preflight(request)
    ship(found[0])  # one workspace image for the whole sweep
    for request in found:
        yield backend.submit(request)


def submit(spec: JobSpec, to: str = "local", *, source: str | None = None) -> Handle:
    """Submit the job (``torchjob submit --to TO``): its handle, ``str()`` is ``TO:ID``."""
    backend = registry.get(to)
    (handle,) = submitted(backend, plan(backend, spec, fresh=True, source=source))
    return handle


def submit_sweep(spec: JobSpec, sweep: Sequence[str], to: str = "local", *,
                 source: str | None = None) -> list[Handle]:
    """``torchjob submit --sweep ARG=V1,V2 ...``: one handle per job (one for a job array)."""
    backend = registry.get(to)
    return list(submitted(backend, plan(backend, spec, fresh=True, source=source,
                                        sweep=sweep)))


def started(backend: Backend, request: Request) -> int:
    """``torchjob run``'s part after the render: preflight, the workspace image, the run."""
    backend.preflight(request)
    ship(request)
    return backend.run(request)


def run(spec: JobSpec, to: str = "local", *, grace: float | None = None,
        source: str | None = None) -> int:
    """``torchjob run``: start the job, print its lines to ``sys.stdout`` as they come, and
    return its exit code (0 done, 1 failed, 143 stopped). Ctrl-C (main thread) cancels it."""
    backend = registry.get(to)
    (request,) = plan(backend, spec, fresh=True, source=source, grace=grace)
    return started(backend, request)


def resolve(handle: HandleLike, to: str | None = None) -> tuple[Backend, Handle]:
    """The backend and handle of ``handle``: a Handle, or ``BACKEND:ID`` (a bare ID with
    ``to``), parsed as the command line parses it."""
    if isinstance(handle, Handle):
        return registry.get(handle.backend), handle
    return registry.parse_handle(handle, to)


def status(handle: HandleLike, *, to: str | None = None, progress: bool = True) -> JobStatus:
    """The job's state now (``torchjob status``), with its progress (step, ETA, restarts,
    the last failure: ``torchjob.jobs.progress``) unless ``progress=False``."""
    backend, found = resolve(handle, to)
    now = backend.status(found)
    return with_progress(backend, now) if progress else now


def with_progress(backend: Backend, now: JobStatus) -> JobStatus:
    """``now`` with the job's progress, where anything tells it (not while it is pending)."""
    told = None if now.state == State.PENDING else backend.progress(now)
    if told is None:
        return now
    return dataclasses.replace(now, progress=told.now(time.time(), not now.state.terminal))


def of_rank(rank: int | None) -> Callable[[str], bool]:
    """Which lines ``--rank`` keeps: a worker's, by the log prefix every backend's lines carry
    (``[node I rank R attempt A]``, also after a backend's own prefix such as TorchX's)."""
    if rank is None:
        return lambda line: True
    pattern = re.compile(rf"(^|\s)\[node \d+ rank {rank} attempt \d+\] ")
    return lambda line: bool(pattern.search(line[:200]))


def logs(handle: HandleLike, *, rank: int | None = None, tail: int | None = None,
         follow: bool = False, log_dir: str | None = None,
         to: str | None = None) -> Iterator[str]:
    """The job's lines (``torchjob logs``): of global rank ``rank`` only; the last ``tail``;
    with ``follow``, then the new ones until the job ends."""
    backend, found = resolve(handle, to)
    if tail is not None and tail < 0:
        raise UserError(f"--tail {tail}: give a number of lines, 0 or more")
    return _lines(backend, found, of_rank(rank), tail, follow, log_dir)


def _lines(backend: Backend, handle: Handle, keep: Callable[[str], bool], tail: int | None,
           follow: bool, log_dir: str | None) -> Iterator[str]:
    skip = 0
    if tail is not None:  # the last N lines so far; then, following, the new ones
        history = list(backend.logs(handle, log_dir=log_dir))
        yield from [line for line in history if keep(line)][-tail:] if tail else []
        if not follow:
            return
        skip = len(history)
    for i, line in enumerate(backend.logs(handle, follow=follow, log_dir=log_dir)):
        if i >= skip and keep(line):
            yield line


def cancel(handle: HandleLike, *, to: str | None = None) -> str:
    """Stop the job (``torchjob cancel``: its workers checkpoint); what was done."""
    backend, found = resolve(handle, to)
    return backend.cancel(found)


def wait(handle: HandleLike, timeout: float | None = None, *,
         to: str | None = None) -> JobStatus:
    """The job's status once it has ended (SUCCEEDED, FAILED, STOPPED, CANCELLED), with its
    progress; after ``timeout`` seconds still running, a TimeoutError that says its state."""
    backend, found = resolve(handle, to)
    if timeout is not None:
        deadline = time.monotonic() + timeout
        while not (now := backend.status(found)).state.terminal:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{found}: still {now.state.value} after {timeout:g} s"
                                   + (f" ({now.detail})" if now.detail else ""))
            time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
    return with_progress(backend, backend.wait(found))


def runs(to: str | Sequence[str] | None = None, *,
         skipped: Callable[[str, UserError], None] | None = None) -> list[JobStatus]:
    """The jobs every backend can list here (``torchjob list``), or those of ``to``, whose
    errors raise; a backend not set up here is left out (told to ``skipped``)."""
    names = [to] if isinstance(to, str) else list(to or registry.names())
    found: list[JobStatus] = []
    for name in names:
        try:
            found += registry.get(name).list()
        except UserError as exc:  # this backend cannot list here (no cluster, no tool)
            if to:
                raise
            if skipped is not None:
                skipped(name, exc)
    return found

"""The one contract every backend keeps (``Backend``: pure ``fits`` and ``render``, then
``preflight``, ``submit``, ``run``, ``status``, ``logs``, ``cancel``, ``list``) and the registry that
finds a backend by name through the ``torchjob.backends`` entry points. Core: imports no backend.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import IO, Any, Callable, TypeVar

from torchjob.jobs.preflight import (check_checkpoints, check_dirs, check_shadowing,
                                     check_syntax)
from torchjob.jobs.progress import Progress, from_run_dir, from_stamped_logs
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.stops import stop_signals
from torchjob.jobs.sweep import Sweep
from torchjob.jobs.values import UserError
from torchjob.trainer.contract import CLOSING, CLOSING_RE, EXIT_FAILED, EXIT_OK, EXIT_STOPPED
# after a stop, how long workers may take to checkpoint before they are killed: the spec's
# stop_grace default (a run's own: spec.stop_grace, or --grace)
from torchjob.trainer.contract import STOP_GRACE_S as GRACE_S

ENTRY_POINT_GROUP = "torchjob.backends"
WAIT_POLL_S = 1.0  # how often ``wait`` asks a job's status
STOP_POLL_S = 0.2  # how often ``run`` looks for a counted stop signal


class BackendError(UserError):
    """A backend that cannot be used as asked (unknown name, missing tool, unsupported
    command): one line, exit 2."""


@dataclass(frozen=True)
class Context:
    """What a render may depend on besides the spec, decided at the edge (the command line)
    so that rendering stays pure: the job's id, the interpreter on the nodes, the directory
    relative paths start at, a free port for a local rendezvous."""

    run_id: str
    python: str = "python"
    workdir: str = "/"
    port: int = 29400
    cpu_count: int = 1
    source: str | None = None  # the spec file's path, for headers that say where they came from
    grace: float = GRACE_S  # after a stop, the kill: spec.stop_grace, or run --grace
    sweep: Sweep | None = None  # a sweep a backend with job arrays renders as one (Slurm)
    workspace: Mapping[str, object] | None = None  # the image of the working directory to
    # build before submitting (jobs.workspace.Workspace.as_option)


@dataclass(frozen=True)
class Request:
    """The exact thing a backend submits: ``data`` (the sbatch script, the compose document,
    the manifest, the AppDef, the command lines) and ``text``, what render prints."""

    backend: str  # the registry name with its variant: "slurm", "k8s:trainjob", "torchx:slurm"
    name: str  # the job's name (spec.name)
    data: Any
    text: str
    spec: JobSpec  # the spec it came from
    context: Context


@dataclass(frozen=True)
class Handle:
    """A submitted job: ``BACKEND:ID`` (``slurm:1234``, ``k8s:default/digits``,
    ``torchx:local_cwd://torchjob/digits-x``), so that status/logs/cancel need no ``--to``."""

    backend: str  # registry name (may include a variant: "k8s:trainjob")
    id: str

    def __str__(self) -> str:
        return f"{self.backend}:{self.id}"


class State(str, enum.Enum):
    """A job's state, in one vocabulary for every backend."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # stopped or preempted after a checkpoint: run again to continue
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self not in (State.PENDING, State.RUNNING, State.UNKNOWN)


# The exit code `torchjob run` ends with for a job that ended in each state, when the backend
# knows no more precise code (the README's table).
STATE_EXIT = {State.SUCCEEDED: EXIT_OK, State.FAILED: EXIT_FAILED, State.STOPPED: EXIT_STOPPED,
              State.CANCELLED: EXIT_STOPPED}


@dataclass(frozen=True)
class JobStatus:
    """What ``torchjob status`` shows (and ``--json`` prints)."""

    handle: Handle
    state: State
    exit_code: int | None = None  # the job's own exit code once it ended, when known
    name: str = ""
    detail: str = ""  # the backend's own words: conditions, Slurm's state, the failing rank
    raw: Mapping[str, Any] = field(default_factory=dict)  # backend-native fields
    created: float | None = None  # when it was submitted (seconds since the epoch), if known
    run_dir: str = ""  # where its run directory is, as the backend knows it
    progress: Progress | None = None  # step, ETA, ... (torchjob.jobs.progress), when known

    def as_json(self) -> dict[str, Any]:
        """Its fields, and the progress' at the top level (``step``, ``total_steps``,
        ``eta``, ...: null when not known), as ``torchjob status --json`` prints them."""
        out = dataclasses.asdict(dataclasses.replace(self, progress=None))
        out.pop("progress")
        out["handle"] = str(self.handle)
        out["backend"] = self.handle.backend
        out["id"] = self.handle.id
        out["state"] = self.state.value
        out["raw"] = dict(self.raw)
        told = self.progress.as_json() if self.progress else Progress().as_json()
        told["progress_source"] = told.pop("source") or None
        return {**out, **told}


class ClosingLines:
    """The agents' closing lines (``torchjob.trainer.contract.CLOSING_RE``) seen in a job's output,
    whatever prefix a line has. How the job failed: the last attempt's line, a first-hand one
    (from the node where the failure began) before one that only heard of it."""

    def __init__(self) -> None:
        self.seen: list[re.Match[str]] = []

    def see(self, line: str) -> None:
        at = line.find(CLOSING)
        if at >= 0 and (found := CLOSING_RE.match(line[at:].rstrip())):
            self.seen.append(found)

    def first(self) -> re.Match[str] | None:
        return min(self.seen, key=lambda m: (-int(m["attempt"]), bool(m["heard"])),
                   default=None)

    def code(self) -> int | None:
        """The job's exit code as the agents said it, when one said."""
        found = self.first()
        return int(found["code"]) if found else None

    def report(self, where: str, err: IO[str]) -> None:
        """The last line of a failed job: its first failure and where the full logs are."""
        if found := self.first():
            print(f"{found.group(0)}; full logs: {where}", file=err, flush=True)


class Backend(abc.ABC):
    """What every backend is: ``fits`` and ``render`` (pure), ``preflight``, ``submit``, and
    ``run`` = submit, follow, Ctrl-C cancels (a second leaves), wait, the job's exit code.
    What a backend cannot offer raises a BackendError that says what to use instead."""

    name: str = ""  # the registry name with its variant
    native_sweep: bool = False  # a sweep is one submission (a Slurm job array)
    sees_run_dir: bool = False  # its nodes see this machine's run directory (jobs.preflight)
    env_secrets: bool = False  # its nodes take the spec's secrets from this environment

    def image_field(self, spec: JobSpec) -> str | None:
        """The spec field naming the image its nodes run the job's code from, when the code
        reaches them only in that image (jobs.workspace); None when they see this machine's."""
        return None

    def fits(self, spec: JobSpec) -> None:
        """Pure: a SpecError/UserError (exit 2) when this backend cannot take ``spec`` as it
        is (limits, fields it cannot honour). Called before every render."""

    @abc.abstractmethod
    def render(self, spec: JobSpec, context: Context) -> Request:
        """Pure: the exact request, as data and as text."""

    def preflight(self, request: Request) -> None:
        """Before run/submit: the secrets, tools, cluster and files the job needs are there;
        else a UserError with the fix (exit 2), nothing submitted."""
        spec, workdir = request.spec, request.context.workdir
        missing = [ref.env for ref in spec.secrets if ref.env not in os.environ]
        if self.env_secrets and missing:
            raise UserError(f"secret variable(s) not set: {', '.join(missing)}; the "
                            f"{self.name} backend reads secrets from your environment "
                            f"(export {missing[0]}=... first)")
        if self.image_field(spec) is None or request.context.workspace is not None:
            check_shadowing(workdir)  # the nodes start in it, or in an image built from it
        check_syntax(spec, workdir, self.nodes_python(request))
        self.ready(request)
        if self.sees_run_dir:
            check_dirs(spec, workdir)
            check_checkpoints(spec, workdir)

    def nodes_python(self, request: Request) -> str | None:
        """The interpreter of this machine that the nodes run the job's code with; None when
        they run an image's or a cluster's own (jobs.preflight.check_syntax)."""
        return None

    def ready(self, request: Request) -> None:
        """Part of preflight: the tools and cluster this backend needs, and the files its
        request names, are there."""

    @abc.abstractmethod
    def submit(self, request: Request) -> Handle:
        """Send exactly ``request``; nothing is rebuilt on the way."""

    def run(self, request: Request) -> int:
        """Submit, print the job's lines as they come, and return its exit code. The first
        Ctrl-C (or SIGTERM) cancels the job (its workers checkpoint) and goes on following it;
        a second leaves it stopping on its own (exit 143), or kills it where it cannot
        outlive the run (``ends_with_run``). A hang-up (SIGHUP) leaves a job that can outlive
        it running (a Slurm job, a PyTorchJob); one that cannot, it stops as Ctrl-C does."""
        handle = self.submit(request)
        print(f"torchjob: submitted {handle}", file=sys.stderr, flush=True)
        closings = ClosingLines()
        with stop_signals() as stops:
            ended = _follow_and_wait(self, handle, request)
            acted = 0  # the stops acted on
            while True:
                while stops.count > acted:  # each in turn: two at once still cancel first
                    acted += 1
                    if stops.hung_up and not self.ends_with_run:
                        return EXIT_STOPPED  # no one follows it now: the job goes on
                    if self._on_stop(handle, acted):
                        return EXIT_STOPPED
                try:
                    item = ended.get(timeout=STOP_POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, JobStatus):
                    break
                if isinstance(item, _Failed):
                    if item.following and acted:
                        continue  # a cancelled job may vanish (Kubernetes deletes it)
                    raise item.error
                closings.see(item)
                print(item, flush=True)
        code = self.exit_code(item, closings)
        if code not in (EXIT_OK, EXIT_STOPPED):
            closings.report(self.logs_place(handle, request), sys.stderr)
        return code

    def _on_stop(self, handle: Handle, nth: int) -> bool:
        """``run``'s ``nth`` stop signal: the first cancels the job, the second kills it
        (``ends_with_run``) or leaves it stopping (True: ``run`` ends); later ones nothing."""
        if nth == 1:
            again = "kills it now" if self.ends_with_run else "to stop waiting"
            print(f"torchjob: {self.cancel(handle)}; Ctrl-C again {again}", file=sys.stderr,
                  flush=True)
        elif nth == 2 and self.ends_with_run:
            print(f"torchjob: {self.kill_now(handle)}", file=sys.stderr, flush=True)
        elif nth == 2:
            print(f"torchjob: {handle} goes on stopping on its own; `torchjob status {handle}` "
                  "follows it", file=sys.stderr, flush=True)
            return True
        return False

    @property
    def ends_with_run(self) -> bool:
        """Whether a job lives only as long as its ``run`` (TorchX's local schedulers keep it
        in that process): a second stop kills it (``kill_now``) rather than leaving it."""
        return False

    def kill_now(self, handle: Handle) -> str:
        """Kill the job at once (``run``'s second stop, where ``ends_with_run``); what was
        done."""
        raise self._unsupported("kill")

    def follow(self, handle: Handle, request: Request) -> Iterator[str]:
        """``run``'s lines of the job, until it has ended."""
        return self.logs(handle, follow=True)

    def logs_place(self, handle: Handle, request: Request) -> str:
        """Where a failed job's full logs are, for its last line."""
        return f"torchjob logs {handle}"

    def wait(self, handle: Handle) -> JobStatus:
        """The job's status once it has ended."""
        while not (status := self.status(handle)).state.terminal:
            time.sleep(WAIT_POLL_S)
        return status

    @staticmethod
    def exit_code(status: JobStatus, closings: ClosingLines | None = None) -> int:
        """The job's exit code: the scheduler's; for a failed job of which it knows none, the
        agents' (``closings``); else the state's."""
        if status.exit_code is not None:
            return status.exit_code
        if status.state == State.FAILED and closings is not None \
                and (said := closings.code()) is not None:
            return said
        return STATE_EXIT.get(status.state, EXIT_FAILED)

    def _unsupported(self, what: str, instead: str = "") -> BackendError:
        return BackendError(f"backend {self.name!r} has no {what}" +
                            (f": {instead}" if instead else ""))

    def status(self, handle: Handle) -> JobStatus:
        raise self._unsupported("status")

    def logs(self, handle: Handle, *, follow: bool = False,
             log_dir: str | None = None) -> Iterator[str]:
        """Every line, each with the one log prefix (``[node N rank R attempt A]``)."""
        raise self._unsupported("logs")

    def progress(self, status: JobStatus) -> Progress | None:
        """How far the job of ``status`` is (torchjob.jobs.progress): from its run directory
        where this machine sees it, else from its logs; None when neither tells yet."""
        if status.run_dir and os.path.isdir(status.run_dir):
            told = from_run_dir(status.run_dir, since=status.created)
            if told is not None or self.sees_run_dir:
                return told
        try:
            return from_stamped_logs(self.stamped_logs(status.handle))
        except (UserError, OSError):  # no logs yet (pods being created), or none kept
            return None

    def stamped_logs(self, handle: Handle) -> Iterator[tuple[float | None, str]]:
        """Every line as ``logs`` gives it, with when it was written where the backend's log
        says (Kubernetes' kubelet), else None: a progress line's ETA ages from then."""
        return ((None, line) for line in self.logs(handle))

    def cancel(self, handle: Handle) -> str:
        """Stop the job (its workers checkpoint where the backend allows); what was done."""
        raise self._unsupported("cancel")

    def list(self) -> list[JobStatus]:
        raise self._unsupported("list")

    def validate(self, text: str, *, strict: bool = True) -> Sequence[str]:
        """Problems of a file written for this backend by hand (a manifest), each naming the
        rule and field; [] when valid. ``strict``: also the platform's own policy."""
        raise self._unsupported("validator of hand-written files",
                                f"torchjob render --to {self.name} JOB.yaml checks a job spec")

    def parse_handle(self, text: str) -> Handle:
        """This backend's handle from the id part the user typed (``1234``, ``ns/name``)."""
        if not text:
            raise BackendError(f"an empty job id for backend {self.name!r}")
        return Handle(self.name, text)


@dataclass(frozen=True)
class _Failed:
    error: Exception
    following: bool  # while following the logs (else while waiting)


def _follow_and_wait(backend: Backend, handle: Handle,
                     request: Request) -> queue.Queue[str | JobStatus | _Failed]:
    """The job's lines, then its final status, from a daemon thread (a stop signal is counted
    meanwhile in the main thread)."""
    out: queue.Queue[str | JobStatus | _Failed] = queue.Queue()

    def follow_and_wait() -> None:
        try:
            for line in backend.follow(handle, request):
                out.put(line)
        except Exception as exc:
            out.put(_Failed(exc, following=True))
        try:
            out.put(backend.wait(handle))
        except Exception as exc:
            out.put(_Failed(exc, following=False))
    threading.Thread(target=follow_and_wait, name="follow", daemon=True).start()
    return out


Factory = Callable[[str], Backend]  # variant ("" for none) -> the backend
B = TypeVar("B", bound=Backend)


def no_variant(cls: type[B]) -> Callable[[str], B]:
    """The ``torchjob.backends`` entry point of a backend that has no variants: ``cls()`` for
    ``NAME``, a BackendError for ``NAME:ANYTHING``."""
    def create(variant: str) -> B:
        if variant:
            raise BackendError(f"backend {cls.name!r} has no variant {variant!r}")
        return cls()
    return create


def _factories() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """The registered backend families (``local``, ``slurm``, ``torchx``, ...)."""
    return sorted(_factories())


def get(name: str) -> Backend:
    """The backend called ``name`` (``slurm``, ``slurm:sbatch``, ``torchx:local_cwd``,
    ``k8s:trainjob``); an unknown one is a BackendError that lists the known ones."""
    family, _, variant = name.partition(":")
    found = _factories()
    if family not in found:
        known = ", ".join(sorted(found)) or "none (is torchjob installed? pip install -e .)"
        raise BackendError(f"unknown backend {name!r}; choose from {known}")
    try:
        factory: Factory = found[family].load()
        return factory(variant)
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, family) from None


# What each backend installs beyond the core (pyproject.toml's extras): the module, the extra.
EXTRAS = {"submitit": "slurm", "kubernetes": "k8s", "torchx": "torchx"}


def missing_extra(exc: ModuleNotFoundError, backend: str) -> Exception:
    """A UserError naming the extra to install when ``exc`` is a backend's optional
    dependency that is missing; else ``exc`` itself (a bug, with its traceback)."""
    root = (exc.name or "").partition(".")[0]
    if root not in EXTRAS:
        return exc
    return UserError(f"the {backend} backend needs the Python package {root}, which is not "
                     f"installed here: pip install 'torchjob[{EXTRAS[root]}]' (or "
                     "'torchjob[all]' for every backend)")


def parse_handle(text: str, default_backend: str | None = None) -> tuple[Backend, Handle]:
    """``slurm:1234`` -> (the slurm backend, its handle). A bare id needs ``default_backend``
    (``--to``)."""
    family, colon, rest = text.partition(":")
    if colon and family in _factories():
        handle = get(family).parse_handle(rest)
    elif default_backend is None:
        raise BackendError(f"job {text!r} does not say its backend: write BACKEND:ID as "
                           f"torchjob submit printed it (e.g. slurm:1234, k8s:default/NAME, "
                           f"local:RUN_ID), or pass --to BACKEND")
    else:
        handle = get(default_backend).parse_handle(text)
    return get(handle.backend), handle

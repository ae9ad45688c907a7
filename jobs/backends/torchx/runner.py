"""The TorchX runner, as the TorchX backend uses it: dryrun, schedule exactly that dryrun,
status, logs, cancel, list; a ``Session`` holds one runner through a whole ``torchjob run``
(local schedulers keep their apps in the memory of the runner that started them)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any, ContextManager

from torchx.runner import Runner, get_runner
from torchx.runner.config import apply as apply_torchxconfig
from torchx.schedulers import slurm_scheduler
from torchx.specs import AppDef, AppDryRunInfo, AppState, AppStatus
from torchx.specs.api import InvalidRunConfigException

from torchjob.jobs.backends.torchx.needs import TorchxError, reachable, renderable, \
    scheduler_errors
from torchjob.jobs.backends.torchx.podman import STOP_GRACE_LABEL

LOCAL_SCHEDULERS = ("local_cwd", "local_docker")


class _SlurmStates(dict[str, AppState]):
    """TorchX 0.7's Slurm scheduler looks sacct's State up whole, so a cancelled job's
    'CANCELLED by 0' fails its describe with an AssertionError (and `torchjob run` with a
    traceback; meta-pytorch/torchx#1373 makes such lookups defensive). Looked up by its first
    word here."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.split(" ", 1)[0], default)


slurm_scheduler.SLURM_STATES = _SlurmStates(slurm_scheduler.SLURM_STATES)


def _unknown(handle: str) -> TorchxError:
    scheduler = handle.partition("://")[0]
    why = (f": TorchX keeps {scheduler} apps only in the process that started them (their "
           "torchjob run), where no other process can see them, while they run or after"
           if scheduler in LOCAL_SCHEDULERS else "")
    return TorchxError(f"TorchX knows no app {handle!r}{why}")


def _cfg(scheduler: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    apply_torchxconfig(scheduler, cfg)  # .torchxconfig in the working directory
    return cfg


def dryrun(app: AppDef, scheduler: str, *, log_dir: str) -> AppDryRunInfo:
    """The scheduler's exact request for ``app`` (what ``torchx run --dryrun`` prints).
    Where the scheduler keeps logs and .torchxconfig does not say, ``log_dir`` (else the
    local schedulers make a temporary directory, and the request differs every time)."""
    renderable(scheduler)
    with get_runner() as runner:
        cfg = _cfg(scheduler)
        if runner.scheduler_run_opts(scheduler).get("log_dir") is not None:
            cfg.setdefault("log_dir", log_dir)
        with scheduler_errors(scheduler, "to render the job"):
            try:
                return runner.dryrun(app, scheduler, cfg=cfg)
            except InvalidRunConfigException as exc:  # e.g. kubernetes without its queue
                raise TorchxError(f"TorchX's {scheduler} scheduler: {exc} (set it in "
                                  f".torchxconfig, section [{scheduler}])") from None


def grace_pods(info: AppDryRunInfo, seconds: int) -> None:
    """Give every pod in a Kubernetes scheduler's request (a Volcano job's tasks, an
    AppWrapper's items) ``seconds`` between its stop signal and the kill, the job's
    ``stop_grace``: TorchX's Role has no such field, and Kubernetes' default is 30 s."""
    from kubernetes.client import V1Pod  # only a Kubernetes scheduler's request has pods

    def walk(node: object) -> None:
        if isinstance(node, V1Pod) and node.spec is not None:
            node.spec.termination_grace_period_seconds = seconds
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(getattr(info.request, "resource", None))


def local_containers(info: AppDryRunInfo, seconds: int, user: str | None) -> None:
    """Every container of a local_docker request labelled with ``seconds`` between its stop
    signal and the kill, the job's ``stop_grace``, which the scheduler's cancel gives it
    (``torchjob.jobs.backends.torchx.podman``: docker's run call has no such setting); run as
    ``user`` where given (``images.invoking_user``), so that the run directory it mounts from
    here is written as the invoking user's."""
    for container in getattr(info.request, "containers", ()):
        labels = container.kwargs.setdefault("labels", {})
        labels[STOP_GRACE_LABEL] = str(seconds)
        if user is not None:
            container.kwargs["user"] = user


def _runner(held: Runner | None) -> ContextManager[Runner]:
    """``held`` (a ``Session``'s runner, left open), else a runner of its own for one call."""
    return contextlib.nullcontext(held) if held is not None else get_runner()


def schedule(info: AppDryRunInfo, held: Runner | None = None) -> str:
    """Submit exactly ``info``; TorchX's app handle. A local scheduler's app only through the
    runner of a ``Session`` (``held``), which the run keeps."""
    if held is None and info._scheduler in LOCAL_SCHEDULERS:
        raise TorchxError(f"TorchX's {info._scheduler} apps live only as long as the process "
                          "that started them: use 'torchjob run --to torchx:"
                          f"{info._scheduler} JOB.yaml'")
    # what it needs was checked in the backend's preflight (ready)
    with _runner(held) as runner, scheduler_errors(info._scheduler, "to submit the job"):
        return str(runner.schedule(info))


class Session:
    """One runner for a whole ``torchjob run``: a local scheduler keeps its app in the memory
    of the runner that started it, so that runner schedules, follows, cancels and waits."""

    def __init__(self) -> None:
        self.runner = get_runner()

    def close(self) -> None:
        self.runner.close()

    def follow(self, handle: str, app: AppDef) -> Iterator[str]:
        """Every replica's lines, ``ROLE/K`` in front, until the app has ended."""
        lines: queue.Queue[str | None] = queue.Queue()
        readers = [threading.Thread(target=self._read, args=(handle, role.name, k, lines),
                                    daemon=True)
                   for role in app.roles for k in range(role.num_replicas)]

        def waiter() -> None:
            try:
                self.runner.wait(handle, wait_interval=0.5)
            finally:
                for reader in readers:
                    reader.join(timeout=5)
                lines.put(None)
        for thread in (*readers, threading.Thread(target=waiter, daemon=True)):
            thread.start()
        while (line := lines.get()) is not None:
            yield line

    def _read(self, handle: str, role: str, k: int, lines: queue.Queue[str | None]) -> None:
        try:
            for line in self.runner.log_lines(handle, role, k, should_tail=True):
                lines.put(f"{role}/{k} {line.rstrip(chr(10))}")
        except Exception as exc:  # noqa: BLE001 - the scheduler's; the run goes on to its end
            lines.put(f"torchjob: the log of {role}/{k} ended early ({type(exc).__name__}: "
                      f"{exc}); the rest: torchjob logs torchx:{handle}")

    def wait(self, handle: str) -> AppStatus:
        """The app's status once it has ended."""
        found = self.runner.wait(handle, wait_interval=0.5)
        if found is None:
            raise _unknown(handle)
        return found


def _ready(handle: str, doing: str) -> ContextManager[None]:
    """The scheduler of ``handle`` checked (``reachable``), and its errors while ``doing``."""
    scheduler = handle.partition("://")[0]
    reachable(scheduler)
    return scheduler_errors(scheduler, doing)


def status(handle: str, held: Runner | None = None) -> AppStatus:
    with _runner(held) as runner, _ready(handle, f"to find {handle}"):
        found = runner.status(handle)
        if found is None:
            raise _unknown(handle)
        return found


def log_lines(handle: str, *, follow: bool = False) -> Iterator[str]:
    with get_runner() as runner, _ready(handle, f"to read the logs of {handle}"):
        app = runner.describe(handle)
        if app is None:
            raise _unknown(handle)
        for role in app.roles:
            for k in range(role.num_replicas):
                for line in runner.log_lines(handle, role.name, k, should_tail=follow):
                    yield f"{role.name}/{k} {line.rstrip()}"


def cancel(handle: str, held: Runner | None = None) -> None:
    with _runner(held) as runner, _ready(handle, f"to cancel {handle}"):
        if runner.status(handle) is None:  # TorchX's cancel of it would do nothing, silently
            raise _unknown(handle)
        runner.cancel(handle)


def list_apps(scheduler: str) -> list[Any]:
    if scheduler in LOCAL_SCHEDULERS:
        raise TorchxError(f"TorchX cannot list {scheduler} apps: it keeps each only in the "
                          "process that started it (its torchjob run)")
    reachable(scheduler)
    with get_runner() as runner, scheduler_errors(scheduler, "to list its jobs"):
        return list(runner.list(scheduler))

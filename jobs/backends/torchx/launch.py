"""The TorchX runner, as the TorchX backend uses it: dryrun, schedule exactly that dryrun, wait
and stream the logs, status, cancel, list.

Local schedulers (``local_cwd``, ``local_docker``) keep an app only in the memory of the
process that started it, so for them a submission waits and streams the logs, as ``torchx
run`` does, and no other process (status, logs, cancel, list) can see the app.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

from torchx.runner import get_runner
from torchx.runner.config import apply as apply_torchxconfig
from torchx.schedulers import slurm_scheduler
from torchx.schedulers.local_scheduler import SignalException
from torchx.specs import AppDef, AppDryRunInfo, AppState, AppStatus
from torchx.specs.api import InvalidRunConfigException

from torchjob.jobs.backend import Closings
from torchjob.jobs.values import UserError
from torchjob.trainer.contract import EXIT_FAILED, EXIT_OK, EXIT_STOPPED

LOCAL_SCHEDULERS = ("local_cwd", "local_docker")


class _SlurmStates(dict[str, AppState]):
    """TorchX 0.7's Slurm scheduler looks sacct's State up whole, so a cancelled job's
    'CANCELLED by 0' fails its describe with an AssertionError (and `torchjob run` with a
    traceback; meta-pytorch/torchx#1373 makes such lookups defensive). Looked up by its first
    word here."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.split(" ", 1)[0], default)


slurm_scheduler.SLURM_STATES = _SlurmStates(slurm_scheduler.SLURM_STATES)


class TorchxError(UserError):
    """A scheduler or handle TorchX cannot use: one line, exit 2."""


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
    with get_runner() as runner:
        if scheduler not in runner.scheduler_backends():
            raise TorchxError(f"unknown TorchX scheduler {scheduler!r}; choose from "
                              f"{', '.join(runner.scheduler_backends())}")
        cfg = _cfg(scheduler)
        if runner.scheduler_run_opts(scheduler).get("log_dir") is not None:
            cfg.setdefault("log_dir", log_dir)
        try:
            return runner.dryrun(app, scheduler, cfg=cfg)
        except InvalidRunConfigException as exc:  # e.g. kubernetes without its queue
            raise TorchxError(f"TorchX's {scheduler} scheduler: {exc} (set it in "
                              f".torchxconfig, section [{scheduler}])") from None


def schedule(info: AppDryRunInfo) -> str:
    """Submit exactly ``info``; TorchX's app handle."""
    if info._scheduler in LOCAL_SCHEDULERS:
        raise TorchxError(f"TorchX's {info._scheduler} apps live only as long as the process "
                          "that started them: use 'torchjob run --to torchx:"
                          f"{info._scheduler} JOB.yaml'")
    with get_runner() as runner:
        return str(runner.schedule(info))


def run(info: AppDryRunInfo) -> int:
    """Schedule ``info``, stream every replica's log with its place in front, wait for the
    end; the exit code: 0 when it succeeded, 143 cancelled, and for a failed app (TorchX
    reports no exit code) the one its agents' closing line gives (else 1), after which that
    line and where the logs are come last."""
    with get_runner() as runner:
        handle = runner.schedule(info)
        print(f"torchx:{handle}", flush=True)
        app = info._app
        assert app is not None
        closings = Closings()
        threads = [threading.Thread(target=_stream, daemon=True,
                                    args=(runner, handle, role.name, k, closings))
                   for role in app.roles for k in range(role.num_replicas)]
        for thread in threads:
            thread.start()
        try:
            final = runner.wait(handle, wait_interval=0.5)
        except (KeyboardInterrupt, SignalException):  # TorchX's local schedulers raise this
            print(f"torchjob: stopping: cancelling torchx:{handle} (its workers checkpoint "
                  "and exit 143)", file=sys.stderr, flush=True)
            runner.cancel(handle)
            final = runner.wait(handle, wait_interval=0.5)
        for thread in threads:
            thread.join(timeout=5)
        state = final.state if final else AppState.UNKNOWN
        print(f"torchjob: torchx:{handle}: {state.name}", file=sys.stderr)
        if state == AppState.SUCCEEDED:
            return EXIT_OK
        if state == AppState.CANCELLED:
            return EXIT_STOPPED
        log_dir = info._cfg.get("log_dir")
        closings.report(f"{log_dir}/{handle.partition('://')[2]}" if log_dir
                        else f"torchjob logs torchx:{handle}", sys.stderr)
        return closings.code() or EXIT_FAILED


def _stream(runner: Any, handle: str, role: str, k: int, closings: Closings) -> None:
    for line in runner.log_lines(handle, role, k, should_tail=True):
        closings.see(line)
        sys.stdout.write(f"{role}/{k} {line}" if line.endswith("\n") else f"{role}/{k} {line}\n")
        sys.stdout.flush()


def status(handle: str) -> AppStatus:
    with get_runner() as runner:
        found = runner.status(handle)
        if found is None:
            raise _unknown(handle)
        return found


def log_lines(handle: str, *, follow: bool = False) -> Iterator[str]:
    with get_runner() as runner:
        app = runner.describe(handle)
        if app is None:
            raise _unknown(handle)
        for role in app.roles:
            for k in range(role.num_replicas):
                for line in runner.log_lines(handle, role.name, k, should_tail=follow):
                    yield f"{role.name}/{k} {line.rstrip()}"


def cancel(handle: str) -> None:
    with get_runner() as runner:
        if runner.status(handle) is None:  # TorchX's cancel of it would do nothing, silently
            raise _unknown(handle)
        runner.cancel(handle)


def list_apps(scheduler: str) -> list[Any]:
    if scheduler in LOCAL_SCHEDULERS:
        raise TorchxError(f"TorchX cannot list {scheduler} apps: it keeps each only in the "
                          "process that started it (its torchjob run)")
    with get_runner() as runner:
        return list(runner.list(scheduler))

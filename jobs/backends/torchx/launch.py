"""Submits a rendered AppDef through the TorchX runner, and reads its status and logs.

Local schedulers (``local_cwd``, ``local_docker``) keep the app only as long as this process
lives, so for them ``submit`` waits and streams the logs, as ``torchx run`` does.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from torchx.runner import get_runner
from torchx.runner.config import apply as apply_torchxconfig
from torchx.specs import AppDef, AppState

from jobs.values import UserError

LOCAL_SCHEDULERS = ("local_cwd", "local_docker")


class TorchxError(UserError):
    """A scheduler or handle TorchX cannot use: one line, exit 2."""


def _cfg(scheduler: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    apply_torchxconfig(scheduler, cfg)  # .torchxconfig in the working directory
    return cfg


def submit(app: AppDef, scheduler: str, *, dry_run: bool = False) -> int:
    with get_runner() as runner:
        if scheduler not in runner.scheduler_backends():
            raise TorchxError(f"unknown TorchX scheduler {scheduler!r}; choose from "
                              f"{', '.join(runner.scheduler_backends())}")
        if dry_run:
            print(runner.dryrun(app, scheduler, cfg=_cfg(scheduler)))
            return 0
        handle = runner.run(app, scheduler, cfg=_cfg(scheduler))
        print(handle, flush=True)
        if scheduler not in LOCAL_SCHEDULERS:
            return 0
        threads = [threading.Thread(target=_stream, args=(runner, handle, role.name, k),
                                    daemon=True)
                   for role in app.roles for k in range(role.num_replicas)]
        for thread in threads:
            thread.start()
        final = runner.wait(handle, wait_interval=0.5)
        for thread in threads:
            thread.join(timeout=5)
        state = final.state if final else AppState.UNKNOWN
        print(f"torchjob: {handle}: {state.name}", file=sys.stderr)
        return 0 if state == AppState.SUCCEEDED else 1


def _stream(runner: Any, handle: str, role: str, k: int) -> None:
    for line in runner.log_lines(handle, role, k, should_tail=True):
        sys.stdout.write(f"{role}/{k} {line}" if line.endswith("\n") else f"{role}/{k} {line}\n")
        sys.stdout.flush()


def status(handle: str) -> int:
    with get_runner() as runner:
        found = runner.status(handle)
        if found is None:
            raise TorchxError(f"TorchX knows no app {handle!r} (local apps exist only while "
                              "their torchjob submit runs)")
        print(found)
        return 0


def logs(handle: str) -> int:
    with get_runner() as runner:
        app = runner.describe(handle)
        if app is None:
            raise TorchxError(f"TorchX knows no app {handle!r}")
        for role in app.roles:
            for k in range(role.num_replicas):
                for line in runner.log_lines(handle, role.name, k):
                    print(f"{role.name}/{k} {line.rstrip()}")
        return 0


def cancel(handle: str) -> int:
    with get_runner() as runner:
        runner.cancel(handle)
        print(f"torchjob: cancelled {handle}")
        return 0

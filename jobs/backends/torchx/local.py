"""TorchX's ``local_cwd`` scheduler, with the kit's stop: a cancel sends every node its stop
signal at once and kills them only after the job's stop grace (TorchX's kills 10 s after the
signal, whatever the job's grace, and a checkpoint that took longer was lost with exit -9), and
an app whose nodes ended stopped (exit 143, some finished) reads CANCELLED whichever thread asks
first (TorchX sets it only after its cancel returns, and a status taken between the nodes' end
and that read FAILED: the run ended 1, not 143). Registered as ``local_cwd`` in pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Any

from torchx.schedulers.api import DescribeAppResponse
from torchx.schedulers.local_scheduler import (CWDImageProvider, LocalScheduler, PopenRequest,
                                               _LocalAppDef)
from torchx.specs import AppDryRunInfo, AppState

from torchjob.trainer.contract import EXIT_OK, EXIT_STOPPED

DEFAULT_STOP_GRACE_S = 10.0  # TorchX's own, for a request without one
_POLL_S = 0.1


@dataclasses.dataclass
class GracefulRequest(PopenRequest):
    """TorchX's request, with the seconds from a cancel's stop signal to the kill."""

    stop_grace: float = DEFAULT_STOP_GRACE_S


def with_grace(info: AppDryRunInfo[Any], seconds: float) -> None:
    """``info``'s request given ``seconds`` of stop grace (shown where the request is)."""
    request = info.request
    fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(PopenRequest)}
    info.request = GracefulRequest(**fields, stop_grace=seconds)


def _codes(app: _LocalAppDef) -> list[int | None]:
    return [r.proc.poll() for replicas in app.role_replicas.values() for r in replicas]


def _signal(app: _LocalAppDef, signum: int) -> None:
    """``signum`` to every node's process group (the agent, its workers) still running."""
    for replicas in app.role_replicas.values():
        for replica in replicas:
            if replica.proc.poll() is None:
                try:
                    os.killpg(replica.proc.pid, signum)
                except ProcessLookupError:
                    pass


class GracefulLocalScheduler(LocalScheduler):
    def __init__(self, session_name: str, cache_size: int = 100) -> None:
        super().__init__(session_name, image_provider_class=CWDImageProvider,
                         cache_size=cache_size)
        self._graces: dict[str, float] = {}
        self._stopping: set[str] = set()

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        request = dryrun_info.request
        self._graces[request.app_id] = getattr(request, "stop_grace", DEFAULT_STOP_GRACE_S)
        return super().schedule(dryrun_info)

    def _cancel_existing(self, app_id: str) -> None:
        """The stop signal to every node at once, and the kill after the app's grace, while
        the caller goes on (its run follows the nodes to their end); a second cancel kills
        now."""
        app = self._apps[app_id]
        if app_id in self._stopping:
            _signal(app, signal.SIGKILL)
            return
        self._stopping.add(app_id)
        _signal(app, signal.SIGTERM)
        grace = self._graces.get(app_id, DEFAULT_STOP_GRACE_S)
        threading.Thread(target=self._kill_after, args=(app, grace), daemon=True,
                         name=f"stop {app_id}").start()

    @staticmethod
    def _kill_after(app: _LocalAppDef, grace: float) -> None:
        deadline = time.monotonic() + grace
        while None in _codes(app) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if None in _codes(app):
            print(f"torchjob: the job's nodes did not end within its stop grace ({grace:g} s) "
                  "of the stop signal: killed (raise stop_grace, or --grace, for a longer "
                  "checkpoint)", file=sys.stderr, flush=True)
            _signal(app, signal.SIGKILL)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """TorchX's, but an app whose nodes all ended, stopped (143) or finished, at least one
        stopped: CANCELLED, as every thread that asks sees it."""
        app = self._apps.get(app_id)
        found = super().describe(app_id)
        if app is not None and found is not None and found.state == AppState.FAILED:
            codes = _codes(app)
            if EXIT_STOPPED in codes and set(codes) <= {EXIT_OK, EXIT_STOPPED}:
                app.state = found.state = AppState.CANCELLED
        return found


def create_scheduler(session_name: str, cache_size: int = 100, **kwargs: Any
                     ) -> GracefulLocalScheduler:
    return GracefulLocalScheduler(session_name, cache_size=cache_size)

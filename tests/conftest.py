"""For every test: torchjob's per-user run index (``torchjob.jobs.runs``) in a temporary directory
instead of the user's ``~/.local/state``: the local and docker runs that tests start are
recorded like any other run."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cpu_use import pytest_runtest_protocol  # noqa: F401 (TORCHJOB_TEST_CPU)
from tests.summaries import SUMMARIES


@pytest.fixture(autouse=True, scope="session")
def run_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``XDG_STATE_HOME`` for this session (inherited by every process a test starts)."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = path = str(tmp_path_factory.mktemp("state"))
    yield path
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


# Tests that use the Slurm dev cluster (tests/slurm) or run the conformance matrix (its
# Slurm columns): they share the cluster's two nodes, and one restarts its daemons
ON_THE_CLUSTER = ("tests/slurm/", "tests/conformance/")
# Files whose tests mostly wait (a collective's timeout, a node started again, a quiet job, a
# stop's grace): handed out first after the cluster's, to run beside the matrix (its columns
# side by side keep both cores busy), so that the files that keep a core busy run beside the
# cluster's Slurm tests, which wait too. A clean run's cores idled 13% of the time, most of it
# while waiting tests met; they idled 15-65% of the time while these ran.
WAITING = ("tests/containers/test_compose_run.py", "tests/k8s/test_k8s_pod_contract.py",
           "tests/integration/test_node_loss.py", "tests/containers/test_torchx_local_docker.py",
           "tests/integration/test_static_rendezvous.py", "tests/integration/test_preemption.py",
           "tests/containers/test_hang_containers.py", "tests/integration/test_run_report.py")


class _ByPriority(OrderedDict):  # type: ignore[type-arg]
    """pytest-xdist's queue of scopes, which hands out the cluster's first, then WAITING's in
    that order, then the rest as xdist ordered them (most tests first)."""

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        if last:
            return super().popitem(last=True)
        scope = min(self, key=_rank)  # the first of the lowest rank: xdist's order among them
        return scope, self.pop(scope)


def _rank(scope: str) -> int:
    if scope == CLUSTER:
        return 0
    return 1 + WAITING.index(scope) if scope in WAITING else 1 + len(WAITING)


CLUSTER = "the Slurm dev cluster"


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """With pytest-xdist's workers (``scripts/bootstrap test``: two): each
    test file goes to one worker as a whole (its module fixtures made once), and every test on
    the Slurm dev cluster to one worker, one after another, handed out first (_ByPriority)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndCluster(LoadScopeScheduling):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.workqueue = _ByPriority()

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return CLUSTER if path.startswith(ON_THE_CLUSTER) else path

    return ByFileAndCluster(config, log)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, in the controller
def pytest_testnodedown(node: Any, error: object) -> None:
    SUMMARIES.extend(tuple(s) for s in getattr(node, "workeroutput", {}).get("summaries", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for title, text in SUMMARIES:
        terminalreporter.write_sep("=", title)
        terminalreporter.write_line(text)

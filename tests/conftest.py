"""For every test: torchjob's per-user run index (``torchjob.jobs.runs``) in a temporary directory
instead of the user's ``~/.local/state``: the local and docker runs that tests start are
recorded like any other run."""

from __future__ import annotations

import os
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


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """With pytest-xdist's workers (``scripts/bootstrap test``: two): each
    test file goes to one worker as a whole (its module fixtures made once), and every test on
    the Slurm dev cluster to one worker, one after another."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndCluster(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return "the Slurm dev cluster" if path.startswith(ON_THE_CLUSTER) else path

    return ByFileAndCluster(config, log)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, in the controller
def pytest_testnodedown(node: Any, error: object) -> None:
    SUMMARIES.extend(tuple(s) for s in getattr(node, "workeroutput", {}).get("summaries", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for title, text in SUMMARIES:
        terminalreporter.write_sep("=", title)
        terminalreporter.write_line(text)

"""Runs the conformance cells that pytest selected, once per session, the backends' columns
side by side (each column's cells one after another), and keeps each cell's outcome and time
for its test (test_matrix.py) and for the table (docs/conformance.md, written from a run of the
whole matrix with TORCHJOB_WRITE_CONFORMANCE=1)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conformance.containers import CONFORMANCE_DOCKER_HOST
from tests.conformance.matrix import COLUMNS, DECLARED, Cell, Column, Outcome, cell_dir
from tests.conformance.scenarios import SCENARIOS, trainer_flags
from tests.conformance.table import table
from tests.summaries import add_summary
from tests.procs import PYTHON, ROOT, env_for_tests, final_params, wait_for
from tests.containers.conftest import container_image  # noqa: F401 (docker, k8s pods' image)
from tests.slurm.conftest import slurm_cluster  # noqa: F401 (the slurm columns' engine)

PARALLEL_ENV = "TORCHJOB_CONFORMANCE_PARALLEL"  # columns run at once (default: all)
TABLE_ENV = "TORCHJOB_WRITE_CONFORMANCE"
TABLE = ROOT / "docs" / "conformance.md"


def selected(session: pytest.Session) -> list[tuple[str, str]]:
    return [item.callspec.params["cell"] for item in session.items
            if hasattr(item, "callspec") and "cell" in item.callspec.params]


@pytest.fixture(scope="session")
def outcomes(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str],
                                                                          Outcome]]:
    cells = selected(request.session)
    columns = {c.backend: c for c in COLUMNS}
    found = {cell: Outcome(DECLARED[cell].kind) for cell in cells
             if cell in DECLARED and DECLARED[cell].kind != "gap"}
    todo = [cell for cell in cells if cell not in found]
    for need in {n for _, backend in todo for n in columns[backend].needs}:
        request.getfixturevalue(need)
    reference = Reference(tmp_path_factory.mktemp("reference"))
    root = tmp_path_factory.mktemp("cells")

    def column(backend: str) -> None:
        for scenario, _ in [c for c in todo if c[1] == backend]:
            found[(scenario, backend)] = run_cell(scenario, columns[backend], root, reference)

    backends = list(dict.fromkeys(backend for _, backend in todo))
    workers = int(os.environ.get(PARALLEL_ENV, "0")) or len(backends) or 1
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(column, backends))
    text = table(found, time.monotonic() - started, workers)
    add_summary(request.config, "conformance matrix", text)
    if os.environ.get(TABLE_ENV) == "1":
        complete = set(found) == {(s, c.backend) for s in SCENARIOS for c in COLUMNS}
        assert complete, f"{TABLE_ENV}=1 writes the table of the whole matrix only"
        TABLE.parent.mkdir(exist_ok=True)
        TABLE.write_text(text)
    yield found


@pytest.fixture(scope="session")
def conformance_docker_api() -> Iterator[str]:
    """The torchx:local_docker column's Docker API: a podman service of its own (started from
    /, on CONFORMANCE_DOCKER_HOST), stopped after the matrix."""
    socket_path = CONFORMANCE_DOCKER_HOST.removeprefix("unix://")
    Path(socket_path).unlink(missing_ok=True)
    service = subprocess.Popen(["podman", "system", "service", "--time=0",
                                CONFORMANCE_DOCKER_HOST], cwd="/", stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)

    def answers() -> bool:
        return subprocess.run(["podman", "--url", CONFORMANCE_DOCKER_HOST, "version"],
                              capture_output=True, check=False).returncode == 0 \
            or service.poll() is not None
    wait_for(answers, 60, f"podman's API service on {CONFORMANCE_DOCKER_HOST}")
    assert service.poll() is None, f"podman system service exited {service.returncode}"
    try:
        yield CONFORMANCE_DOCKER_HOST
    finally:
        service.terminate()
        service.wait(timeout=60)
        Path(socket_path).unlink(missing_ok=True)


def run_cell(scenario: str, column: Column, root: Path, reference: Reference) -> Outcome:
    workdir = cell_dir(root, column.backend, scenario)
    workdir.mkdir()
    cell = Cell(scenario, column, workdir, reference.params)
    started = time.monotonic()
    try:
        SCENARIOS[scenario](cell)
        status, detail = "pass", ""
    except Exception:
        status, detail = "fail", traceback.format_exc()
    try:
        cell.close()  # a cell that leaves something running fails
    except Exception:
        status, detail = "fail", detail + traceback.format_exc()
    return Outcome(status, time.monotonic() - started, detail)


class Reference:
    """The final parameters of the cells' job run once under plain torchrun (2 processes,
    the same flags and seed), the run every backend's must equal, bit for bit."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.lock = threading.Lock()
        self.found: dict | None = None

    def params(self) -> dict:
        with self.lock:
            if self.found is None:
                proc = subprocess.run(
                    [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                     "2", "-m", "torchjob.trainer", "--run-dir", str(self.folder),
                     *trainer_flags()],
                    cwd=self.folder, env=env_for_tests(), capture_output=True, text=True,
                    timeout=300, stdin=subprocess.DEVNULL)
                assert proc.returncode == 0, proc.stderr[-3000:]
                self.found = final_params(self.folder / "checkpoints")
            return self.found

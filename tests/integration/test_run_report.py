"""The run report in a real headless Chromium (tests/browser.py), of a real run: the built-in
trainer on the local backend, 2 ranks, held at the conformance gate (tests/conformance/gate.py)
where rank 1 is stopped (SIGSTOP): the hang watchdog names it, writes the stacks and restarts
the group from the step-4 checkpoint, and the run finishes. The page loads without a console
error or a request beyond itself, and shows the curves, each rank's step times, the one restart
and the one hang (culprit and stack link). Its screenshot: build/artifacts/report.png."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.browser import Browser
from tests.conformance.gate import GATE_ENV
from tests.procs import ROOT, TORCHJOB, env_for_tests, free_port, torchjob, wait_for
from torchjob.trainer import ledger

pytestmark = pytest.mark.integration

ARTIFACTS = ROOT / "build" / "artifacts"
RUN_TIMEOUT_S = 240
SETS = ("nproc_per_node=2", "max_restarts=2", "hang_timeout=5", "checkpoint_budget=4",
        "run_dir=runs/job", "trainer.args.task=tests.conformance.gate:digits",
        "trainer.args.max_steps=12", "trainer.args.checkpoint_every=4",
        "trainer.args.log_every=1", "trainer.args.eval_every_steps=3",
        "trainer.args.progress=lines")
SERIES = """[...document.querySelectorAll('[data-series]')].map(g => [g.dataset.series,
    g.dataset.rank ?? null, Number(g.dataset.points ?? g.querySelectorAll('rect[data-ms]').length)])"""
TIMELINE = """[...document.querySelectorAll('#timeline [data-event]')].map(li => [li.dataset.event,
    li.dataset.culpritRanks ?? null, li.textContent,
    [...li.querySelectorAll('a[data-culprit-stack]')].map(a => a.href)])"""


def hang_run(cwd: Path) -> Path:
    """The run (see the module's docstring); its run directory, once it has finished (exit 0)."""
    gate = cwd / "gate"
    words = [*SETS, f"rdzv.port={free_port()}", f"env.{GATE_ENV}={gate}"]
    argv = [*TORCHJOB, "run", str(ROOT / "jobs" / "examples" / "default.yaml"),
            *[w for s in words for w in ("--set", s)]]
    log = cwd / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env_for_tests(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    text = lambda: log.read_text(errors="replace")  # noqa: E731
    try:
        def held() -> dict[int, int] | bool:
            assert proc.poll() is None, f"the run ended before its gate:\n{text()[-4000:]}"
            found = {int(p.name[3:]): int(p.read_text().split()[0]) for p in gate.glob("at-*")}
            return len(found) == 2 and found
        pids = wait_for(held, RUN_TIMEOUT_S, f"2 ranks at the gate {gate}")
        os.kill(pids[1], signal.SIGSTOP)  # rank 1 hangs
        (gate / "go").touch()
        wait_for(lambda: proc.poll() is not None, RUN_TIMEOUT_S,
                 "the run to notice the hang, restart and finish")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"exit code {proc.returncode}:\n{text()[-4000:]}"
    assert "torchjob: hang on node 0: rank 1 on node 0 (its process is stopped" in text(), \
        text()[-4000:]
    return cwd / "runs" / "job"


def test_the_report_of_a_run_with_a_restart_and_a_hang(tmp_path: Path) -> None:
    run_dir = hang_run(tmp_path)
    done = torchjob("report", "runs/job", cwd=tmp_path, env=env_for_tests())
    assert done.returncode == 0, done.stderr
    page = run_dir / "report.html"
    assert done.stdout.strip() == "runs/job/report.html"
    browser = Browser()
    try:
        browser.open(page.resolve().as_uri())
        assert browser.problems() == [], browser.problems()
        assert browser.requests() == [page.resolve().as_uri()]  # nothing fetched but itself
        series = browser.evaluate(SERIES)
        timeline = browser.evaluate(TIMELINE)
        stragglers = browser.evaluate("document.querySelector('[data-stragglers]') !== null")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = browser.screenshot(ARTIFACTS / "report.png")
    finally:
        browser.close()
    shutil.copy(page, ARTIFACTS / "report.html")
    print(f"screenshot of the report: {ARTIFACTS / 'report.png'}")
    lines = {(name, rank): count for name, rank, count in series}
    assert lines[("train-loss", None)] == 12 and lines[("eval-loss", None)] == 4, series
    assert lines[("eval-accuracy", None)] == 4, series
    assert lines[("step-time", "0")] >= 2 and lines[("step-time", "1")] >= 2, series
    assert stragglers
    events = [event for event, *_ in timeline]
    assert events == ["round", "hang", "restart", "round"], timeline
    _, culprits, text, links = timeline[1]
    assert culprits == "1" and "culprit rank 1 on node 0 (its process is stopped" in text, text
    hang = next(r for r in ledger.read(run_dir) if r["event"] == "hang")
    frame = hang["culprits"][0]["frame"]  # at_gate, when rank 1 was seen there before its stop
    assert (f"(its process is stopped (state T)) at {frame};" if frame else
            "(its process is stopped (state T)); waiting") in text, text
    assert links == [(run_dir / "hangs" / "attempt0" / "node0-rank1.txt").resolve().as_uri()]
    assert Path(links[0].removeprefix("file://")).is_file()
    assert "resumes from step_00000004" in timeline[2][2], timeline[2]
    assert shot.startswith(b"\x89PNG") and len(shot) > 20_000

"""``torchjob status`` of real local jobs: a running trainer job shows a rising step and an ETA
(``--json`` and in words), ``--watch`` on a terminal redraws in place and ends with the job.
On every backend: the steps a script that calls nothing of the kit did, as its agents counted
them (the conformance matrix's examples/script.yaml row), and the steps after a restart (its
kill row)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.procs import ROOT, TORCHJOB, env_for_tests, free_port, torchjob, wait_for

pytestmark = pytest.mark.integration

DEFAULT = ROOT / "jobs" / "examples" / "default.yaml"
DEADLINE_S = 180
REDRAW = "\x1b[J"  # what --watch writes before each frame after the first


def status(handle: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    shown = torchjob("status", "--json", handle, cwd=cwd, env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    told: dict[str, Any] = json.loads(shown.stdout)
    return told


def read_pty(fd: int, until: Any, seconds: float, what: str) -> str:
    """What the terminal showed until ``until(text)`` holds; the deadline's message quotes it."""
    text, deadline = "", time.monotonic() + seconds
    while not until(text):
        left = deadline - time.monotonic()
        assert left > 0, f"no {what} within {seconds:g} s; the terminal showed:\n{text[-3000:]}"
        if select.select([fd], [], [], min(left, 1.0))[0]:
            try:
                text += os.read(fd, 65536).decode(errors="replace")
            except OSError:  # the other side closed: the program ended
                assert until(text), f"no {what}; the terminal showed:\n{text[-3000:]}"
    return text


def test_a_running_jobs_step_rises_with_an_eta_and_watch_follows_it_to_the_end(
        tmp_path: Path) -> None:
    env = env_for_tests(OMP_NUM_THREADS="1")
    sets = ["nproc_per_node=1", "trainer.args.epochs=400", "trainer.args.log_every=5",
            f"rdzv.port={free_port()}"]
    sub = torchjob("submit", "--to", "local", str(DEFAULT),
                   *[w for s in sets for w in ("--set", s)], cwd=tmp_path, env=env)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    handle = sub.stdout.strip().splitlines()[-1]
    try:
        def moving(after: int) -> dict[str, Any] | None:
            told = status(handle, tmp_path, env)
            assert told["state"] in ("PENDING", "RUNNING"), told
            return told if (told["step"] or 0) > after and told["eta"] is not None else None

        first = wait_for(lambda: moving(0), DEADLINE_S, f"a step and an ETA in {handle}'s status")
        later = wait_for(lambda: moving(first["step"]), DEADLINE_S,
                         f"a step past {first['step']} in {handle}'s status")
        assert later["total_steps"] == first["total_steps"] > later["step"], later
        assert later["eta"] > 0 and later["samples_per_s"] > 0 and later["epoch"] >= 0, later
        assert later["progress_source"] == str(tmp_path / "runs" / "digits"), later
        assert (later["restarts"], later["culprit"]) == (0, ""), later
        words = torchjob("status", handle, cwd=tmp_path, env=env).stdout
        assert re.search(rf"progress: step \d+/{later['total_steps']} \(\d+%\), epoch \d+, "
                         r"[\d.e+]+ samples/s, ETA \d+:\d\d:\d\d", words), words

        # --watch on a terminal: redrawn in place; it ends by itself once the job has ended
        main, other = pty.openpty()
        watch = subprocess.Popen([*TORCHJOB, "status", "--watch", handle], cwd=tmp_path,
                                 env=env, stdin=subprocess.DEVNULL, stdout=other,
                                 stderr=subprocess.STDOUT)
        os.close(other)
        try:
            shown = read_pty(main, lambda t: t.count(REDRAW) >= 2, 60, "two redraws")
            assert f"{handle}: RUNNING" in shown and "progress: step" in shown, shown
            cancel = torchjob("cancel", handle, cwd=tmp_path, env=env)
            assert cancel.returncode == 0, cancel.stdout + cancel.stderr
            shown += read_pty(main, lambda t: re.search(r": (STOPPED|CANCELLED)", t), 120,
                              "the ended state")
            assert watch.wait(timeout=60) == 0, shown
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
            os.close(main)
    finally:
        if status(handle, tmp_path, env)["state"] in ("PENDING", "RUNNING"):
            torchjob("cancel", handle, cwd=tmp_path, env=env)
        wait_for(lambda: status(handle, tmp_path, env)["state"] not in ("PENDING", "RUNNING"),
                 DEADLINE_S, f"{handle} to end")

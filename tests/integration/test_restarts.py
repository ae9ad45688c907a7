"""kill -9 of one worker in the middle of a run: torchrun restarts the group, the trainer
resumes from its newest checkpoint, and the job ends with the parameters of an uninterrupted
run, bit for bit. Many trials, because a restart that works once proves little
(../shared/TEST-HOST.md: without the kit's settings, half of torchrun's restarts failed here).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.procs import (ROOT, TORCHJOB, alive, assert_bitwise_equal, env_for_tests,
                         final_params, last_step, torchjob, trainer_workers, wait_for)

pytestmark = pytest.mark.integration
TRIALS = int(os.environ.get("TORCHJOB_RESTART_TRIALS", "3"))  # 50 by hand (README)
JOB = ROOT / "jobs" / "examples" / "default.yaml"
SETTINGS = ["trainer.args.epochs=3", "trainer.args.checkpoint_every=10",
            "trainer.args.log_every=1", "trainer.args.progress=lines",
            "trainer.args.eval_every=0", "max_restarts=2"]


def run_args(run_dir: Path) -> list[str]:
    """``torchjob run JOB --set ...``'s words after ``torchjob``."""
    sets = [arg for s in [*SETTINGS, f"run_dir={run_dir}"] for arg in ("--set", s)]
    return ["run", str(JOB), *sets]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    run = tmp_path_factory.mktemp("reference")
    proc = torchjob(*run_args(run), env=env_for_tests(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return final_params(run / "checkpoints")


def test_kill_9_of_a_worker_restarts_and_ends_bitwise_equal(tmp_path: Path,
                                                            reference: dict) -> None:
    rng = random.Random(1234)
    failures = []
    for trial in range(TRIALS):
        run = tmp_path / f"trial{trial}"
        kill_at = rng.randint(3, 55)  # of 66 steps: before, at and after checkpoint boundaries
        log = open(tmp_path / f"trial{trial}.log", "w+")
        started = time.monotonic()
        proc = subprocess.Popen([*TORCHJOB, *run_args(run)], env=env_for_tests(), stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: last_step(run) >= kill_at or proc.poll() is not None, 120,
                     f"step {kill_at}")
            workers = trainer_workers(proc.pid)
            assert len(workers) == 2, f"expected 2 trainer processes, found {workers}"
            victim = rng.choice(workers)
            os.kill(victim, signal.SIGKILL)
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        log.seek(0)
        out = log.read()
        problem = None
        if code != 0:
            problem = f"exit {code}"
        elif "restart 1" not in out:
            problem = "no restart seen"
        else:
            try:
                assert_bitwise_equal(final_params(run / "checkpoints"), reference)
            except AssertionError as exc:
                problem = str(exc)
        print(f"trial {trial}: killed pid {victim} at step >= {kill_at}: "
              f"{problem or 'ok'} in {time.monotonic() - started:.1f}s")
        if problem:
            failures.append(f"trial {trial} (kill at step {kill_at}): {problem}\n{out[-3000:]}")
    assert not failures, f"{len(failures)}/{TRIALS} trials failed:\n" + "\n".join(failures)


def test_sigterm_to_the_launcher_checkpoints_exits_143_and_resumes(tmp_path: Path,
                                                                   reference: dict) -> None:
    proc = subprocess.Popen([*TORCHJOB, *run_args(tmp_path)], env=env_for_tests(),
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: last_step(tmp_path) >= 25 or proc.poll() is not None, 120, "step 25")
    workers = trainer_workers(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM" in err
    assert not [p for p in workers if alive(p)], "a worker outlived the launcher"
    steps = sorted(int(p.name[5:]) for p in (tmp_path / "checkpoints").glob("step_*"))
    assert 25 <= steps[-1] < 66, f"the stop checkpoint should be mid-run: {steps}"

    # damage the newest checkpoint: the next run must fall back to the one before and say so
    newest = sorted((tmp_path / "checkpoints").glob("step_*"))[-1]
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    again = torchjob(*run_args(tmp_path), env=env_for_tests(), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"skipping checkpoint {newest.name}: state.pt does not match its checksum" \
        in again.stderr
    assert "resumed from step_" in again.stderr
    assert_bitwise_equal(final_params(tmp_path / "checkpoints"), reference)

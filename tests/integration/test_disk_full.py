"""A disk that fills up under a job: its run directory on a small tmpfs of its own.

A checkpoint that does not fit used to end the job with torch's zip writer's "unexpected pos"
(the full disk only further up its traceback), left its half-written files there, and the
launcher, whose record is on the same disk, crashed with tracebacks of its own. Now the save
removes what it wrote, the job fails at once (a restart would only fill the disk again) with
a line that says where, what is free and what to do, and once there is room the next run
resumes from the newest checkpoint, which is whole. Every way the trainer saves: replicated
(DDP) and sharded (FSDP), synchronous and in the background.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import ROOT, TORCHJOB, env_for_tests, torchjob, wait_for
from torchjob.jobs.runs import Record
from torchjob.trainer.checkpoint import verify

pytestmark = pytest.mark.integration


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs: one checkpoint of the default job (1.8 MB) fits, the next does not."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def leftovers(disk: Path) -> list[str]:
    """Half-written files: a checkpoint's temporary directory, a summary, progress or record
    being replaced."""
    return [str(p) for p in disk.rglob(".*") if p.name != ".torchjob" and
            not (p.parent.name.startswith("step_") and p.name == ".metadata")]


@pytest.mark.parametrize("how", [[], ["--set", "trainer.args.async_checkpoint=true"],
                                 ["--set", "trainer.args.parallel=fsdp"],
                                 ["--set", "trainer.args.parallel=fsdp",
                                  "--set", "trainer.args.async_checkpoint=true"]],
                         ids=["ddp", "ddp-async", "fsdp", "fsdp-async"])
def test_a_checkpoint_that_does_not_fit_fails_the_job_cleanly_and_the_next_run_resumes(
        small_disk: Path, how: list[str]) -> None:
    job = ["run", str(ROOT / "jobs/examples/default.yaml"), "--set", f"run_dir={small_disk}",
           "--set", "trainer.args.epochs=6", *how]  # 132 steps: saves at 50, 100, 132
    out = torchjob(*job, env=env_for_tests(), timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    launcher = [line for line in text.splitlines() if not line.startswith("[node ")]
    assert not any("Traceback" in line for line in launcher), text[-3000:]
    # sharded, a rank's error reaches the others pickled, without the OSError it was raised
    # while handling: torch's zip writer's own is all there is to say then
    assert re.search(r"the job failed: node 0 rank \d raised CheckpointWriteError: cannot write "
                     f"checkpoint step_00000100 in {re.escape(str(small_disk))}/checkpoints: "
                     r"(No space left on device|a write fell short, as on a full disk) .*"
                     r"\(\d+ MiB free there\)", text), text[-3000:]
    assert "the newest one there is step_00000050" in text, text[-3000:]
    assert "restarting" not in text, text[-3000:]  # a restart would fill the disk again
    assert leftovers(small_disk) == [], leftovers(small_disk)
    assert sorted(p.name for p in (small_disk / "checkpoints").iterdir()) == ["step_00000050"]
    verify(small_disk / "checkpoints" / "step_00000050")  # whole: it verifies
    (record,) = (small_disk / ".torchjob").iterdir()
    assert Record(record).read()["state"] == "FAILED"

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    again = torchjob(*job, env=env_for_tests(), timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "resumed from step_00000050" in again.stderr, again.stderr[-3000:]


# The user's script fills the disk and goes on printing until the launcher said it cannot
# write its record (that disk is full), then frees it. The run goes on, every line still
# reaches the terminal, and the end is recorded once there is room again.
FILLS = """\
import os, sys, time
filler = os.path.join(os.environ["TORCHJOB_RUN_DIR"], "filler")
with open(filler, "wb") as f:
    try:
        while True:
            f.write(b"x" * 65536)
            f.flush()
    except OSError as exc:
        print(f"disk full: {exc.strerror}", flush=True)
deadline = time.monotonic() + 60
i = 0
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    print(f"line {i} while the disk is full", flush=True)
    i += 1
    time.sleep(0.02)
os.unlink(filler)
print("the disk has room again", flush=True)
"""


def test_a_launcher_whose_record_cannot_be_written_runs_the_job_to_its_end(
        small_disk: Path, tmp_path: Path) -> None:
    (small_disk / "fills.py").write_text(FILLS)
    go, err = tmp_path / "go", tmp_path / "stderr"  # not on the small disk
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([*TORCHJOB, "run", "--nproc-per-node", "1", "--set",
                                 f"run_dir={small_disk}", "fills.py", str(go)], cwd=small_disk,
                                env=env_for_tests(), stdout=subprocess.PIPE, stderr=stderr,
                                stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: "torchjob: cannot write the run's record " in err.read_text(),
                     60, "the launcher to say it cannot write its record")
            go.touch()
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = out.decode(errors="replace") + err.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert not any("Traceback" in line for line in text.splitlines()), text[-3000:]
    for said in ["disk full: No space left on device", "line 0 while the disk is full",
                 "the disk has room again"]:
        assert said in text, (said, text[-3000:])
    (record,) = (small_disk / ".torchjob").iterdir()
    assert Record(record).read()["state"] == "SUCCEEDED"
    assert leftovers(small_disk) == [], leftovers(small_disk)


def test_a_run_whose_record_cannot_be_made_starts_nothing(small_disk: Path) -> None:
    (small_disk / "filler").write_bytes(b"")
    with open(small_disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        except OSError:
            pass
    out = torchjob("run", str(ROOT / "jobs/examples/default.yaml"), "--set",
                   f"run_dir={small_disk}/digits", env=env_for_tests(), timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "torchjob: cannot write the run's record in " in out.stderr, out.stderr
    assert "No space left on device" in out.stderr and "Traceback" not in out.stderr
    assert not (small_disk / "digits" / ".torchjob").exists() or not any(
        (small_disk / "digits" / ".torchjob").iterdir())

"""The run and checkpoint directories are checked before any work (torchjob.trainer.dirs): by
the trainer on every rank and by the agent, so that a job started by hand (torchrun, srun, a
pod) stops with exit 2 and one clear line instead of a traceback at the first save."""

from __future__ import annotations

import errno
import pickle
import subprocess
from pathlib import Path

import pytest

from torchjob.trainer.dirs import WriteRefused, unusable, write_failure, write_whole, writing
from tests.procs import PYTHON, env_for_tests


def test_what_makes_a_directory_unusable(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert unusable(tmp_path / "new" / "deeper") is None  # made with its parents
    assert unusable(tmp_path) is None
    assert unusable(tmp_path / "afile") == f"{tmp_path / 'afile'} is a file, not a directory: " \
        "name a directory (or move the file away)"
    assert "afile (on its path) is a file" in str(unusable(tmp_path / "afile" / "x" / "y"))
    assert "is a broken symbolic link" in str(unusable(tmp_path / "dangling" / "x"))
    locked = tmp_path / "locked"
    locked.mkdir()
    subprocess.run(["chattr", "+i", str(locked)], check=True)  # read-only for root too
    try:
        assert "(on its path) cannot be written (Operation not permitted)" in str(
            unusable(locked / "checkpoints"))
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert list(locked.iterdir()) == [] and not list(tmp_path.glob(".torchjob-probe-*"))


@pytest.mark.parametrize("agent", [False, True])
def test_the_trainer_and_the_agent_stop_before_training(tmp_path: Path, agent: bool) -> None:
    (tmp_path / "afile").write_text("")
    trainer = ["-m", "torchjob.trainer", "--run-dir", "run", "--checkpoint-dir", "afile/ck",
               "--epochs", "1", "--progress", "lines"]
    argv = [PYTHON, "-m", "torchjob.trainer.agent", "--checkpoint-dir", "afile/ck",
            "--standalone", "--nproc-per-node", "1", *trainer] if agent else [PYTHON, *trainer]
    proc = subprocess.run(argv, cwd=tmp_path, env=env_for_tests(), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "afile (on its path) is a file, not a directory" in proc.stderr.splitlines()[-1]
    assert " step " not in proc.stderr and "Traceback" not in proc.stderr


def test_what_the_file_system_refused_is_found_behind_the_error_raised() -> None:
    """torch.save reports a full disk as its zip writer's RuntimeError, raised while handling
    the OSError; torch.distributed.checkpoint gathers each rank's error, pickled (what it was
    raised while handling is lost), into one exception that is no Exception."""
    def raised_while(handling: BaseException, then: BaseException) -> BaseException:
        try:
            try:
                raise handling
            except BaseException:
                raise then
        except BaseException as exc:
            return exc

    full = OSError(errno.ENOSPC, "No space left on device")
    writer = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert write_failure(full) == "No space left on device"
    assert write_failure(raised_while(full, writer)) == "No space left on device"

    class CheckpointException(BaseException):
        def __init__(self, failures: dict[int, tuple[BaseException, object]]) -> None:
            self.failures = failures

    gathered = CheckpointException({0: (pickle.loads(pickle.dumps(writer)), None)})
    assert str(write_failure(gathered)).startswith("a write fell short, as on a full disk "
                                                   "([enforce fail at inline_container.cc")
    both = CheckpointException({0: (writer, None), 1: (full, None)})
    assert write_failure(both) == "No space left on device"  # the errno, where one rank has it
    assert write_failure(ValueError("not a write")) is None
    assert write_failure(raised_while(ValueError("x"), KeyError("y"))) is None


def test_a_whole_write_that_fails_leaves_no_half_file(tmp_path: Path) -> None:
    target, tmp = tmp_path / "summary.json", tmp_path / "gone" / ".summary.json.part"
    with pytest.raises(FileNotFoundError):
        write_whole(target, "{}", tmp)
    assert list(tmp_path.iterdir()) == []
    write_whole(target, "{}\n", tmp_path / ".part")
    assert target.read_text() == "{}\n" and not (tmp_path / ".part").exists()
    (tmp_path / "adir").mkdir()
    with pytest.raises(WriteRefused, match=r"cannot write .*/adir: Is a directory "
                       r"\(\d+ MiB free there\): free space there, or set run_dir"):
        with writing(tmp_path / "adir"):
            (tmp_path / "adir").write_text("")

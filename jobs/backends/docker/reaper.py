"""The containers of a ``torchjob run --to docker`` whose launcher is gone (killed outright:
no handler of its ran) are stopped as a Ctrl-C stops them (SIGTERM: the workers checkpoint
and exit 143), then removed with their network, as a local run's nodes stop
(trainer.orphans). The launcher starts this watch before ``compose up``, in a session of its
own, holding the only write end of its stdin: the pipe's end without ``done`` is the
launcher's death (no poll). Why and how: docs/internals.md."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from torchjob.jobs.backends.docker.engine import PROJECT_LABEL, Engine, down
from torchjob.trainer.runlock import clear as clear_lock

DONE = b"done"


def watch(engine: Engine, project: str, file: Path, grace: float, run_dir: Path,
          log: Path) -> subprocess.Popen[bytes]:
    """The watch over ``project``'s containers for this launcher; ``release`` it when the
    launcher has ended them itself."""
    argv = [sys.executable, "-m", "torchjob.jobs.backends.docker.reaper", engine.name,
            str(len(engine.compose)), *engine.compose, project, str(file),
            str(math.ceil(grace)), str(run_dir)]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=out,
                                start_new_session=True)


def release(reaper: subprocess.Popen[bytes]) -> None:
    """The launcher ended its containers itself: the watch ends without touching them."""
    try:
        assert reaper.stdin is not None
        reaper.stdin.write(DONE)
        reaper.stdin.close()
        reaper.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass  # it is gone already, or will end on its own


def main(argv: list[str]) -> int:
    name, count = argv[0], int(argv[1])
    engine = Engine(name, tuple(argv[2:2 + count]))
    project, file, grace, run_dir = argv[2 + count:]
    if sys.stdin.buffer.read() == DONE:
        return 0
    print(f"torchjob: the launcher of {project} is gone: stopping its containers (SIGTERM, "
          f"up to {grace} s), then removing them", flush=True)
    ids = subprocess.run([name, "ps", "-q", "--filter", f"label={PROJECT_LABEL}={project}"],
                         capture_output=True, text=True, check=False, timeout=120).stdout.split()
    if ids:  # all at once, as the launcher's own stop
        subprocess.run([name, "stop", "-t", grace, *ids], stdin=subprocess.DEVNULL,
                       check=False, timeout=int(grace) + 120)
    down(engine, project, Path(file))
    clear_lock(Path(run_dir), project)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

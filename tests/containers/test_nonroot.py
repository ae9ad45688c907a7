"""`torchjob run --to docker` and `--to torchx:local_docker` as a user who is not root, with
podman rootless (its containers in a user namespace of that user's), from a home directory
only that user can read (mode 700): the job runs, and what it writes into the run directory is
that user's. The rest of the suite runs as root, where neither path was ever taken: the
containers ran as the user's ids in podman's default user namespace (a sub-uid on the host:
the run directory's files could not be written), because podman-compose 1.0 drops
``userns_mode: keep-id`` and the Docker API client refuses it.

The module makes a user of its own (sub-ids, a fuse-overlayfs store), lets it reach this
interpreter, loads the kit's image into its store, and removes all of it afterwards.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import PYTHON, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.containers]

USER = "torchjob-nonroot"
SUBIDS = 65536
STORAGE_CONF = ('[storage]\ndriver = "overlay"\n[storage.options.overlay]\n'
                'mount_program = "/usr/bin/fuse-overlayfs"\n')
SCRIPT = ("import os\nrank = os.environ['RANK']\n"
          "print('rank', rank, 'read', open('data.txt').read(), flush=True)\n"
          "open(f'runs/out-{rank}.txt', 'w').write(rank)\n")


def as_user(command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``command`` (a shell line) run by the test's user in a login shell, in its home."""
    return subprocess.run(["su", "-", USER, "-c", command], capture_output=True, text=True,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def free_subids() -> int:
    """The first id past every range in /etc/subuid and /etc/subgid (at least 300000)."""
    start = 300000
    for path in ("/etc/subuid", "/etc/subgid"):
        text = Path(path).read_text() if Path(path).exists() else ""
        for line in text.splitlines():
            parts = line.split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                start = max(start, int(parts[1]) + int(parts[2]))
    return start


def closed_dirs(path: Path) -> list[Path]:
    """The directories above ``path`` that others cannot pass through (no o+x)."""
    return [parent for parent in Path(path).parents
            if not parent.stat().st_mode & stat.S_IXOTH]


def remove_user() -> None:
    """The user, its processes (podman's pause process, an API service), store and home."""
    if subprocess.run(["id", USER], capture_output=True, check=False).returncode:
        return
    as_user("podman system reset -f", timeout=300)
    uid = pwd.getpwnam(USER).pw_uid
    Path(f"/tmp/torchx_docker_network_lock-{uid}").unlink(missing_ok=True)
    subprocess.run(["pkill", "-KILL", "-u", USER], check=False)
    for _ in range(100):  # what pkill signalled is gone before userdel
        if subprocess.run(["pgrep", "-u", USER], capture_output=True,
                          check=False).returncode:
            break
        time.sleep(0.1)
    subprocess.run(["userdel", "-r", USER], capture_output=True, check=False)
    # podman's run and temporary directories, where the user has no XDG_RUNTIME_DIR
    for runtime in (f"/tmp/podman-run-{uid}", f"/tmp/containers-user-{uid}"):
        shutil.rmtree(runtime, ignore_errors=True)
    for path in ("/etc/subuid", "/etc/subgid"):
        lines = Path(path).read_text().splitlines(keepends=True)
        Path(path).write_text("".join(x for x in lines if not x.startswith(f"{USER}:")))


@pytest.fixture(scope="module")
def user(container_image: str) -> Iterator[Path]:
    """The test's user, with the kit's image in its store; its home (mode 700)."""
    remove_user()  # a run that was killed left it
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
    first = free_subids()
    for path in ("/etc/subuid", "/etc/subgid"):  # useradd gives them where login.defs says
        text = Path(path).read_text() if Path(path).exists() else ""
        if not any(line.startswith(f"{USER}:") for line in text.splitlines()):
            with open(path, "a") as ids:
                ids.write(f"{USER}:{first}:{SUBIDS}\n")
    home = Path(pwd.getpwnam(USER).pw_dir)
    home.chmod(0o700)
    if Path("/usr/bin/fuse-overlayfs").exists():  # the store podman's docs advise on this kernel
        conf = home / ".config" / "containers" / "storage.conf"
        conf.parent.mkdir(parents=True)
        conf.write_text(STORAGE_CONF)
        shutil.chown(home / ".config", USER, USER)
        for sub in conf.parent, conf:
            shutil.chown(sub, USER, USER)
    # the user runs this interpreter and checkout: the directories above them it could not
    # pass through are opened for passing (not listing) while the module runs
    opened = {d: d.stat().st_mode for d in closed_dirs(Path(os.path.realpath(PYTHON)))
              + closed_dirs(ROOT / "x")}
    for directory, mode in opened.items():
        directory.chmod(mode | stat.S_IXOTH)
    archive = Path(f"/var/tmp/torchjob-nonroot-{os.getpid()}.tar")
    try:
        subprocess.run(["podman", "save", "-o", str(archive), container_image], check=True,
                       capture_output=True, timeout=600)
        archive.chmod(0o644)
        loaded = as_user(f"podman load -i {archive}")
        assert loaded.returncode == 0, loaded.stderr[-3000:]
        archive.unlink()
        yield home
    finally:
        archive.unlink(missing_ok=True)
        for directory, mode in opened.items():
            directory.chmod(mode)
        remove_user()


def torchjob_as_user(work: Path, *argv: str, env: str = "") -> subprocess.CompletedProcess[str]:
    """``torchjob ARGV`` run by the test's user in ``work``, as the suite runs it."""
    line = (f"cd {shlex.quote(str(work))} && {env} PYTHONPATH={shlex.quote(str(ROOT))} "
            f"OMP_NUM_THREADS=1 {shlex.quote(PYTHON)} -m torchjob.jobs "
            + " ".join(shlex.quote(a) for a in argv))
    return as_user(line)


def workdir(home: Path, name: str) -> Path:
    """A directory of the user's with the test's script and the data it reads."""
    work = home / name
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    (work / "data.txt").write_text("the user's data")
    for path in (work, work / "train.py", work / "data.txt"):
        shutil.chown(path, USER, USER)
    return work


def written_by_the_user(work: Path, out: str) -> None:
    uid = pwd.getpwnam(USER).pw_uid
    assert "rank 1 read the user's data" in out, out[-3000:]
    for rank in (0, 1):
        found = work / "runs" / f"out-{rank}.txt"
        assert found.read_text() == str(rank) and found.stat().st_uid == uid, out[-3000:]
    owners = {p.stat().st_uid for p in (work / "runs").rglob("*")}
    assert owners == {uid}, (owners, out[-3000:])


def test_compose_runs_a_script_and_the_trainer_as_the_user(user: Path) -> None:
    work = workdir(user, "compose")
    proc = torchjob_as_user(work, "run", "--to", "docker", "--nproc-per-node", "2", "train.py")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    written_by_the_user(work, proc.stdout + proc.stderr)
    trained = torchjob_as_user(work, "run", "--to", "docker", "--set", "nnodes=2", "--set",
                               "trainer.args.epochs=1", str(ROOT / "jobs/examples/default.yaml"))
    assert trained.returncode == 0, (trained.stdout + trained.stderr)[-3000:]
    assert list((work / "runs" / "digits" / "checkpoints").glob("step_*")), trained.stderr
    written_by_the_user(work, proc.stdout + proc.stderr)


def test_torchx_local_docker_runs_a_script_as_the_user(user: Path) -> None:
    """Through the user's own podman API service, with a TorchX lock file of root's in /tmp
    (TorchX's one lock for every user could not be opened by a second one)."""
    work = workdir(user, "torchx")
    sock = f"/tmp/torchjob-nonroot-{os.getpid()}.sock"
    Path("/tmp/torchx_docker_network_lock").touch()  # as a root user's earlier run left it
    service = subprocess.Popen(["su", "-", USER, "-c", f"exec podman system service --time=0 "
                                f"unix://{sock}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not Path(sock).exists():
            assert service.poll() is None and time.monotonic() < deadline, \
                f"the user's podman API service made no socket {sock} in 60 s"
            time.sleep(0.1)
        proc = torchjob_as_user(work, "run", "--to", "torchx:local_docker", "--nproc-per-node",
                                "2", "train.py", env=f"DOCKER_HOST=unix://{sock}")
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        written_by_the_user(work, proc.stdout + proc.stderr)
    finally:
        subprocess.run(["pkill", "-u", USER, "-f", "podman system service"], check=False)
        service.wait(timeout=60)
        Path(sock).unlink(missing_ok=True)

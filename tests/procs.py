"""Helpers for tests that start real processes: the torchjob command, descendants, final
parameters, free ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable

import torch

from torchjob.jobs.invocation import free_port as pick_port
from torchjob.trainer import stacks
from torchjob.trainer.hang import beside  # noqa: F401 (the tests' loop beside a block)
from torchjob.trainer.contract import SERVER_NAME

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def env_for_tests(**extra: str) -> dict[str, str]:
    """The test process's environment, minus any launcher variables it may have inherited."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PET_", "TORCHELASTIC_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


TORCHJOB = (PYTHON, "-m", "torchjob.jobs")  # the torchjob command, for tests that Popen it


def torchjob(*argv: str, cwd: Path | str = ROOT, env: Mapping[str, str] | None = None,
             timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``torchjob ARGV`` in ``cwd``, to its end, its output captured as text. ``env`` is the
    whole environment (None: this process's, as it is; ``env_for_tests()`` without launcher
    variables); standard input is ``input``, else empty (never the terminal)."""
    return subprocess.run([*TORCHJOB, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, input=input,
                          stdin=subprocess.DEVNULL if input is None else None)


LINGER_AT_EXIT = """\
import atexit, os, time

def _linger():  # the interpreter is exiting: say so, then hold the process open a while
    open(os.path.join(os.environ["LINGER_DIR"], str(os.getpid())), "w").close()
    time.sleep(float(os.environ["LINGER_S"]))

atexit.register(_linger)
"""


def with_sitecustomize(folder: Path, code: str) -> str:
    """A PYTHONPATH under which every Python process started runs ``code`` first (as the
    ``sitecustomize`` written to ``folder/hook``), then finds this repository's packages."""
    hook = folder / "hook"
    hook.mkdir(parents=True)
    (hook / "sitecustomize.py").write_text(code)
    return os.pathsep.join([str(hook), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def after_import(names: tuple[str, ...], call: str) -> str:
    """``sitecustomize`` code that runs ``call(module)`` (a function defined before it) as each
    module of ``names`` has just been executed, on its first import in the process."""
    return f'''
import importlib.abc as _abc, importlib.machinery as _machinery, sys as _sys


class _Finder(_abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in {names!r}:
            return None
        spec = _machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module
        def exec_module(module):
            execute(module)
            {call}(module)
        spec.loader.exec_module = exec_module
        return spec


_sys.meta_path.insert(0, _Finder())
'''


def linger_at_exit(folder: Path, seconds: float) -> dict[str, str]:
    """Environment for Python processes that, as their interpreter begins to exit, each write
    a file named by their pid into ``folder`` and then wait ``seconds``: a window in which to
    send a signal to a process whose work is done."""
    return {"PYTHONPATH": with_sitecustomize(folder, LINGER_AT_EXIT), "LINGER_DIR": str(folder),
            "LINGER_S": str(seconds)}


def lingering(folder: Path) -> list[int]:
    """The pids that have begun to exit under ``linger_at_exit(folder, ...)``."""
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


_given: set[int] = set()  # never the same port twice a session: the matrix's cells run at once
_giving = threading.Lock()


def free_port() -> int:
    """A port nothing listens on now, below the kernel's ephemeral range (the product's own
    pick, jobs.invocation.free_port), that no other caller of this session was given."""
    with _giving:
        port = pick_port("", taken=_given)
        _given.add(port)
        return port


def children(pid: int) -> list[int]:
    """Direct children of ``pid``, read from /proc."""
    return [kid for kid, _ in stacks.children(pid)]


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for kid in children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def is_fork_server(pid: int) -> bool:
    """``torchjob.trainer.agent``'s fork server: a fork of the agent named ``SERVER_NAME``."""
    return stacks.process_name(pid) == SERVER_NAME


def trainer_workers(root_pid: int) -> list[int]:
    """The trainer processes below ``root_pid``: forked by ``torchjob.trainer.agent``'s preloaded
    server (they share its command line, so they are told by their parent), or started by a
    plain torchrun as ``python -m torchjob.trainer``."""
    found = []
    for pid in descendants(root_pid):
        line = cmdline(pid)
        if is_fork_server(parent(pid)):
            found.append(pid)
        elif line.startswith(tuple(f"{p} -m torchjob.trainer " for p in ("python", "python3",
                                                                         PYTHON))):
            found.append(pid)
    return found


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stop_again(proc: subprocess.Popen[Any], first: float) -> None:
    """A second Ctrl-C to ``proc``, the first having been sent at ``first`` (monotonic): a
    second after it at the earliest, as a person's second press comes, well past
    ``SAME_STOP_S`` (torchjob takes one sooner for the first passed on again by a wrapper)
    and the lag of a signal handler in the main thread (up to a look of its loop)."""
    time.sleep(max(0.0, first + 1.0 - time.monotonic()))
    proc.send_signal(signal.SIGINT)


class Terminal:
    """``argv`` run in a terminal of its own (a pseudo-terminal that is its controlling one,
    as an ssh session's is), its output read as it comes; ``hang_up`` closes the terminal, as
    a dropped ssh connection or a closed window does (the kernel sends SIGHUP)."""

    def __init__(self, argv: list[str], cwd: Path, env: Mapping[str, str]) -> None:
        import pty
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(["setsid", "--ctty", *argv], cwd=cwd, env=env,
                                     stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self._hang_up = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Its output until the hang-up, then the terminal closed here: a read in progress
        would hold it open (and the kernel would send no SIGHUP)."""
        import select
        try:
            while not self._hang_up.is_set():
                if select.select([self.master], [], [], 0.05)[0]:
                    try:
                        chunk = os.read(self.master, 65536)
                    except OSError:  # the command ended: its side closed
                        chunk = b""
                    if not chunk:
                        self._hang_up.wait()
                    self.output += chunk
        finally:
            os.close(self.master)

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def hang_up(self) -> None:
        self._hang_up.set()
        self._reader.join(timeout=10)
        assert not self._reader.is_alive(), "the terminal was not closed"

    def close(self) -> None:
        """Hung up, and the command killed if it is still running."""
        self.hang_up()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def last_step(run_dir: Path) -> int:
    """The highest training step logged to RUN_DIR/metrics.jsonl so far."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return max(steps)


def final_params(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """The model state of the newest checkpoint."""
    newest = sorted(checkpoint_dir.glob("step_*"))[-1]
    return torch.load(newest / "state.pt", weights_only=True)["model"]


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ: {different}"


def require_setup(argv: list[str], *, timeout: float, what: str,
                  env: dict[str, str] | None = None) -> str:
    """Run a set-up script (cluster, image) and return its output. When it fails, the test is
    skipped with the reason, so a user sees what did not run; under CI (``CI=true``) it fails
    instead, since a skip there would hide a broken set-up."""
    import fcntl

    import pytest

    # one set-up at a time on this machine (pytest-xdist's workers each ask for it; apt-get
    # and an image build cannot run twice at once): the second waits, then finds it done
    with open(SETUP_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        code, output = run_setup(argv, timeout, env)
    if code != 0:
        why = "cannot run here" if code == 2 else f"exit code {code}"
        tail = "\n".join(output.rstrip().splitlines()[-40:])
        reason = f"{what} failed ({why}):\n{tail}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return output


SETUP_LOCK = "/tmp/torchjob-tests-setup.lock"


def run_setup(argv: list[str], timeout: float,
              env: dict[str, str] | None) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=env, check=False)
        code: int | None = proc.returncode
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        output = "".join(s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
                         for s in (exc.stdout, exc.stderr))
        output += f"\n(timed out after {timeout:g} s)"
    return code, output

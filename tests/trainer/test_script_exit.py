"""A user's script ends under ``python -m torchjob.trainer.script`` as under ``python`` itself:
the same exit code, the same standard error (its own excepthook, its traceback from its own
first frame, a SyntaxError's lines alone) and the same files (what it left unclosed is written),
though the runner leaves without the interpreter's C++ teardown (trainer/script.py)."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from tests.procs import PYTHON, env_for_tests

SCRIPTS = {
    "unclosed": "log = open('out.txt', 'w')\nlog.write('never closed\\n')\n"
                "raw = open('out.bin', 'wb')\nraw.write(b'bytes')\n",
    "excepthook": "import sys\n"
                  "def hook(kind, exc, tb):\n"
                  "    print(f'HOOK {kind.__name__}: {exc}', file=sys.stderr)\n"
                  "    open('out.txt', 'w').write('hook ran')\n"
                  "sys.excepthook = hook\nraise RuntimeError('boom')\n",
    "traceback": "def f():\n    raise ValueError('bad\\nsecond line')\nf()\n",
    "syntax": "x = (\n",
    "assert": "assert 1 == 2\n",
    # what it left to its objects' __del__ and to a gzip file's close (its trailer), once it
    # ended well; after a failure its globals are kept, but the gzip file is still whole
    "teardown": "import gzip\nclass Writer:\n    def __init__(self, path):\n"
                "        self.file = open(path, 'w')\n    def __del__(self):\n"
                "        self.file.write('last line')\n        self.file.close()\n"
                "log, _log = Writer('out.log'), Writer('out._log')\n"
                "z = gzip.GzipFile('out.gz', 'wb', mtime=0)\nz.write(b'payload ' * 100)\n",
    "gzip_then_raise": "import gzip\nz = gzip.GzipFile('out.gz', 'wb', mtime=0)\n"
                       "z.write(b'payload ' * 100)\nraise RuntimeError('after the write')\n",
}


def run(argv: list[str], cwd: Path) -> tuple[int, str, dict[str, bytes]]:
    """Its exit code, standard error and the files it wrote (then removed)."""
    done = subprocess.run(argv, cwd=cwd, env=env_for_tests(), capture_output=True, text=True,
                          timeout=120)
    files = {p.name: p.read_bytes() for p in sorted(cwd.glob("out.*"))}
    for name in files:
        (cwd / name).unlink()
    return done.returncode, done.stderr, files


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_ends_as_under_python(tmp_path: Path, name: str) -> None:
    (tmp_path / "train.py").write_text(SCRIPTS[name])
    seen = [run([PYTHON, *head, "train.py"], tmp_path)
            for head in ([], ["-m", "torchjob.trainer.script"])]
    assert seen[1] == seen[0], seen
    if name == "unclosed":
        assert seen[0][2] == {"out.bin": b"bytes", "out.txt": b"never closed\n"}
    if name == "teardown":
        assert seen[0][2]["out.log"] == seen[0][2]["out._log"] == b"last line"
    if "gzip" in name or name == "teardown":
        assert gzip.decompress(seen[0][2]["out.gz"]) == b"payload " * 100


@pytest.mark.parametrize("end", ["", "import sys\nsys.exit(0)\n"])
def test_a_module_ends_as_under_python(tmp_path: Path, end: str) -> None:
    """``-m MODULE``: runpy gives ``__main__`` back to the runner when the module returns, so
    what is freed at the end is the module's globals, never the runner's own."""
    (tmp_path / "train.py").write_text(SCRIPTS["teardown"] + end)
    seen = [run([PYTHON, *head, "-m", "train"], tmp_path)
            for head in ([], ["-m", "torchjob.trainer.script"])]
    assert seen[1] == seen[0] and seen[0][0] == 0, seen
    assert seen[0][2]["out.log"] == b"last line"


# The agent's own exit, with c10d's keep-alive as it was when a stop reached a pod whose
# store pod went with it: a daemon thread in a store call as the store's host goes. Through
# the interpreter's teardown that thread was ended coming back from C++: "terminate called
# without an active exception", exit 134 (139 as a container's PID 1), not the agent's code.
AGENT_AS_ITS_STORE_GOES = """
import atexit, runpy, subprocess, sys, threading
from datetime import timedelta
from torch.distributed import TCPStore
server = subprocess.Popen([sys.executable, "-c", "import time\\n"
    "from torch.distributed import TCPStore\\n"
    "store = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\\n"
    "print(store.port, flush=True)\\ntime.sleep(600)"], stdout=subprocess.PIPE, text=True)
client = TCPStore("127.0.0.1", int(server.stdout.readline()), is_master=False,
                  timeout=timedelta(seconds=60))
calling = threading.Event()
def keep_alive():
    calling.set()
    while True:
        try:
            client.compare_set("state", "", "mine")
        except Exception:
            pass
threading.Thread(target=keep_alive, daemon=True).start()
calling.wait()
atexit.register(lambda: (server.kill(), server.wait()))  # the store's host goes as it exits
sys.argv = ["torchjob.trainer.agent", "--help"]
runpy.run_module("torchjob.trainer.agent", run_name="__main__")
"""


def test_the_agent_exits_with_its_code_while_a_thread_is_in_a_call_to_a_store_that_went(
        tmp_path: Path) -> None:
    code, stderr, _ = run([PYTHON, "-c", AGENT_AS_ITS_STORE_GOES], tmp_path)
    assert code == 0, f"exit {code}: {stderr[-2000:]}"
    assert "terminate called" not in stderr


def test_a_lost_peer_says_the_scripts_own_line() -> None:
    """A wait that timed out may be the script's own (a store key it misspelt): its one line
    says where, the frames inside torch left out."""
    import torch.distributed as dist
    from torchjob.trainer.script import waited_at

    store = dist.HashStore()
    store.set_timeout(__import__("datetime").timedelta(milliseconds=10))
    try:
        store.get("confg")  # the line named
    except dist.DistStoreError as exc:
        where = waited_at(exc)
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "# the line named" in text)
    assert where == f" at {__file__}:{line}", where

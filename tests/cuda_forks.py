"""A recorder, installed in every Python process of a run through a ``sitecustomize`` on
PYTHONPATH, of each CUDA device query or initialisation and each fork (``os.fork`` and
multiprocessing's, through ``os.register_at_fork``), and the rule it checks: no process forks
after it has queried CUDA. A child forked from such a process fails at its first CUDA call
("Cannot re-initialize CUDA in forked subprocess"). No GPU is needed: the calls are recorded
whatever they return. A ``fork + exec`` (subprocess) starts a fresh process and is not a fork
here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.procs import after_import, with_sitecustomize

LOG_ENV = "TORCHJOB_CUDA_FORK_LOG"

RECORDER = '''\
import json, os, traceback

_LOG = os.environ["TORCHJOB_CUDA_FORK_LOG"]
_QUERIED = []  # this process's CUDA calls so far (a forked child inherits its parent's)
_DEPTH = [0]
# device queries and initialisation: each one makes a later fork unsafe with a CUDA build
_CUDA = ("is_available", "device_count", "init", "_lazy_init", "set_device", "current_device",
         "get_device_properties", "get_device_capability", "get_device_name",
         "is_bf16_supported", "mem_get_info", "synchronize", "get_rng_state_all",
         "set_rng_state_all", "get_rng_state", "set_rng_state")
_C = ("_cuda_getDeviceCount", "_cuda_init", "_cuda_setDevice", "_cuda_getDevice")


def _write(event, **fields):
    with open("/proc/self/cmdline", "rb") as cmdline:
        argv = cmdline.read().decode(errors="replace").split("\\0")[:6]
    line = json.dumps({"event": event, "pid": os.getpid(), "ppid": os.getppid(),
                       "argv": argv, **fields}) + "\\n"
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _caller():
    for frame in reversed(traceback.extract_stack()[:-3]):
        if not frame.filename.startswith("<") and "/torch/" not in frame.filename \\
                and "sitecustomize" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} {frame.name}"
    return "?"


def _wrap(owner, name, label):
    real = getattr(owner, name, None)
    if real is None or getattr(real, "_recorded", False):
        return
    def recorded(*args, **kwargs):
        if _DEPTH[0] == 0:  # the outermost call only
            where = _caller()
            _QUERIED.append(f"{label} from {where}")
            _write("cuda", call=label, where=where)
        _DEPTH[0] += 1
        try:
            return real(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1
    recorded._recorded = True
    setattr(owner, name, recorded)


def _instrument(module):
    if module.__name__ == "torch.cuda":
        for name in _CUDA:
            _wrap(module, name, f"torch.cuda.{name}")
        import torch
        for name in _C:
            _wrap(torch._C, name, f"torch._C.{name}")
    elif module.__name__ == "torch.accelerator":
        for name in ("is_available", "device_count", "set_device_index", "current_device_index"):
            _wrap(module, name, f"torch.accelerator.{name}")


def _forked():
    _write("fork", inherited=list(_QUERIED))


os.register_at_fork(after_in_child=_forked)
_write("start")
''' + after_import(("torch.cuda", "torch.accelerator"), "_instrument")


def recording_env(folder: Path) -> dict[str, str]:
    """Environment for a run whose every Python process records into ``folder/log.jsonl``."""
    return {"PYTHONPATH": with_sitecustomize(folder, RECORDER), LOG_ENV: str(folder / "log.jsonl")}


def read(folder: Path) -> list[dict[str, Any]]:
    log = folder / "log.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def assert_no_fork_after_cuda(records: list[dict[str, Any]]) -> None:
    """Fail naming each fork whose parent had queried CUDA, with the parent and its calls."""
    argv = {r["pid"]: r["argv"] for r in records if r["event"] in ("start", "fork")}
    bad = [f"pid {r['pid']} was forked from pid {r['ppid']} "
           f"({' '.join(argv.get(r['ppid'], ['?']))}) after that process had called "
           f"{'; '.join(r['inherited'][:3])}"
           for r in records if r["event"] == "fork" and r["inherited"]]
    assert not bad, "forked after querying CUDA:\n" + "\n".join(bad)

"""A recorder, installed in every Python process of a run through a ``sitecustomize`` on
PYTHONPATH, of each call that makes the host wait for all the work queued on a GPU stream
(``.item()`` of a device tensor, a blocking copy, ``torch.cuda.synchronize``): torch's own
sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``) is switched on in each process
after its first optimizer step (set-up is not a step), and each of its warnings is written
down with the Python frames that made it. A training step that does this waits for itself:
the GPU idles while the loop prepares the next step. Without CUDA nothing is switched on and
nothing is recorded but that first step (``armed``)."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

from tests.procs import after_import, with_sitecustomize

LOG_ENV = "TORCHJOB_CUDA_SYNC_LOG"

RECORDER = '''\
import json, os, traceback, warnings

_LOG = os.environ["TORCHJOB_CUDA_SYNC_LOG"]


def _write(event, **fields):
    with open(_LOG, "a") as log:  # O_APPEND: one line, whole, whoever writes beside it
        log.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\\n")


def _frames():
    return [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
            for f in traceback.extract_stack()[:-2]
            if "/torch/" not in f.filename and "sitecustomize" not in f.filename
            and "warnings" not in f.filename and not f.filename.startswith("<")]


_shown = warnings.showwarning


def _show(message, category, filename, lineno, file=None, line=None):
    if "synchroniz" not in str(message):
        return _shown(message, category, filename, lineno, file, line)
    frames = _frames()
    _write("sync", where=frames[-1] if frames else f"{filename}:{lineno}", stack=frames[-12:])


_armed = []


def _arm(module):
    def first_step(optimizer, args, kwargs):
        if _armed:
            return
        import torch
        cuda = torch.cuda.is_initialized()
        if cuda:
            warnings.filterwarnings("always", message=".*synchroniz")
            warnings.showwarning = _show
            torch.cuda.set_sync_debug_mode("warn")
        _armed.append(cuda)
        _write("armed", cuda=cuda)
    module.register_optimizer_step_post_hook(first_step)
''' + after_import(("torch.optim.optimizer",), "_arm")


def recording_env(folder: Path) -> dict[str, str]:
    """Environment for a run whose every Python process records into ``folder/log.jsonl``."""
    return {"PYTHONPATH": with_sitecustomize(folder, RECORDER), LOG_ENV: str(folder / "log.jsonl")}


def read(folder: Path) -> list[dict[str, Any]]:
    log = folder / "log.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def per_place(records: list[dict[str, Any]], outside: tuple[str, ...] = ()
              ) -> collections.Counter[str]:
    """How often each line of Python made the host wait, leaving out the waits with a frame
    of a function named in ``outside`` (an evaluation, the final checkpoint)."""
    return collections.Counter(
        r["where"] for r in records if r["event"] == "sync"
        and not any(f.rsplit(" ", 1)[-1] in outside for f in r["stack"]))

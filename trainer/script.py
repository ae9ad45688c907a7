"""``python -m torchjob.trainer.script SCRIPT ARGS...`` (or ``-m MODULE ARGS...``): a user's script
run as ``python SCRIPT ARGS...`` runs it, except that how it failed is told to its agent
(trainer.failures): a lost peer exits ``EXIT_RETRY``; any other exception is recorded in
torchelastic's error file and exits 1. The agent starts every worker that is not the built-in
trainer through this. What it emulates, and the teardown it skips: docs/internals.md.
"""

from __future__ import annotations

import _io
import atexit
import builtins
import gc
import importlib.machinery
import io
import json
import os
import runpy
import sys
import threading
import time
import traceback
import types
import zipfile
from pathlib import Path
from typing import NoReturn

from torchjob.trainer import progress
from torchjob.trainer.contract import EXIT_CONFIG, EXIT_RETRY
from torchjob.trainer.dirs import write_whole
from torchjob.trainer.orphans import die_with_parent

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # set by torch's agent for each worker


def record(exc: BaseException) -> None:
    """Write ``exc`` to the worker's error file in torchelastic's format (what its
    ``@record`` writes), when the agent asked for one."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    data = {"message": {"message": f"{type(exc).__name__}: {exc}", "extraInfo": {
        "py_callstack": "".join(traceback.format_exception(exc)),
        "timestamp": str(int(time.time()))}}}
    try:
        # whole or not at all: a stop that lands as it writes left an empty file, which ended
        # torch's agent (json.load's error) before it said why the job failed
        write_whole(Path(path), json.dumps(data), Path(f"{path}.{os.getpid()}.part"))
    except OSError:
        pass  # the agent then names the exit code alone


def run_script(path: str) -> None:
    """Run the file ``path`` as ``python PATH`` does: as ``__main__`` (what pickle and
    multiprocessing find), ``__file__`` absolute, ``sys.argv[0]`` left as given (runpy's
    run_path would set it to the path it ran). A directory or zip file with a __main__.py
    goes to runpy."""
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        OWN.append(runpy.run_path(path, run_name="__main__"))
        return
    full = os.path.abspath(path)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=full, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", full),
                         __builtins__=builtins)
    with io.open_code(full) as file:
        code = compile(file.read(), full, "exec", dont_inherit=True)
    sys.modules["__main__"] = main
    OWN.append(main.__dict__)
    exec(code, main.__dict__)


def main(argv: list[str]) -> int:
    if not argv or argv[0] == "-m" and len(argv) < 2:
        print("usage: python -m torchjob.trainer.script SCRIPT [ARGS...] | -m MODULE [ARGS...]",
              file=sys.stderr)
        return EXIT_CONFIG
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            OWN.append(runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
            run_script(argv[0])
    except SystemExit as exc:
        if (first := user_frames(exc.__traceback__)) is not None:
            OWN.append(first.tb_frame.f_globals)  # the script's, or runpy's copy of a module's
        return exit_code(exc)
    except KeyboardInterrupt as exc:
        print_exception(exc.with_traceback(user_frames(exc.__traceback__)))
        return 130
    except BaseException as exc:
        return failed(exc)
    return 0


# Every exception ``failed`` saw, and a run the trainer refused, kept until the process exits
# (os._exit: ``leave``, or the fork server's child): its traceback holds the model, and freeing
# DDP's reducer once a peer's container is gone blocked in ProcessGroupGloo's destructor for
# minutes, so that the node never heard that another had failed the job.
RAISED: list[BaseException] = []
# the globals of the script (or module) it ran, for ``free_main``: not this module's, which a
# module run by runpy gives ``__main__`` back to
OWN: list[dict[str, object]] = []
FREE_S = 10.0  # the most ``free_main`` takes (a destructor that blocks: leave without it)


def failed(exc: BaseException) -> int:
    """A worker's exception: recorded for its agent, its traceback printed as the interpreter
    prints it, and the exit code: ``EXIT_RETRY`` when it only says a peer is gone (then one
    line, not the traceback of a collective that lost its peer), else 1. The exception is kept
    (``RAISED``)."""
    from torchjob.trainer.failures import exception_line, is_peer_loss, lost_peer

    exc = exc.with_traceback(user_frames(exc.__traceback__))
    RAISED.append(exc)
    record(exc)
    peer = is_peer_loss(exc)
    if peer:
        text = exception_line(f"{type(exc).__name__}: {exc}")
        print(f"torchjob: {lost_peer(text)} ({text}){waited_at(exc)}: the agent restarts the "
              "group", file=sys.stderr)
    else:
        print_exception(exc)
    sys.stderr.flush()
    return EXIT_RETRY if peer else 1


def waited_at(exc: BaseException) -> str:
    """`` at FILE:LINE``: the script's own line where a call into torch lost its peer (a wait
    that timed out may be the script's own, a store key it misspelt); empty when none."""
    import torch

    inside = os.path.dirname(torch.__file__) + os.sep
    mine = [f for f in traceback.extract_tb(exc.__traceback__)
            if not f.filename.startswith(inside)]
    return f" at {mine[-1].filename}:{mine[-1].lineno}" if mine else ""


def user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from the script's first frame on: without this module's and runpy's, as python
    would show it (a script's SyntaxError: none)."""
    while tb is not None and any(tb.tb_frame.f_globals is g for g in (globals(), vars(runpy))):
        tb = tb.tb_next
    return tb


def print_exception(exc: BaseException) -> None:
    """Through ``sys.excepthook``, as the interpreter reports an uncaught exception: a hook
    the script set (one that sends crashes to a tracker) sees it."""
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:  # a hook that failed: what the interpreter then prints too
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exc()
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(exc)


def exit_code(exc: SystemExit) -> int:
    """The exit code the interpreter makes of ``exc`` (a message: said on stderr, 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def leave(code: int, free: bool = False) -> NoReturn:
    """Exit with ``code`` as the interpreter would, without its C++ teardown (module doc); with
    ``free``, the script's globals freed first (``free_main``)."""
    shutdown = getattr(threading, "_shutdown", None)  # joins non-daemon threads, as at exit
    if shutdown is not None:
        progress.exiting()  # the threads it waits for, to the hang watchdog
        shutdown()
    atexit._run_exitfuncs()
    if free:
        free_main(code)
    leave_now(code)


def flush_files() -> None:
    """Flush every file object the script left open, outermost layer first (a text file's
    buffer, then its bytes'), as the interpreter's teardown would: os._exit drops what a
    buffer still holds. Flushed, not closed (a daemon thread may still write to one), but for
    a file written through Python (gzip, bz2, lzma): its close writes what it owes the file
    (a gzip trailer), which no flush does."""
    # by type (fast, and no object's own __class__ is asked: torch's deprecated aliases warn)
    files = [o for o in gc.get_objects() if issubclass(type(o), _io._IOBase)]
    for layer in (io.TextIOBase, io.BufferedIOBase, io.RawIOBase):
        for file in files:
            try:
                if issubclass(type(file), layer) and file.writable() and not file.closed:
                    file.flush() if type(file).__module__ == "_io" else file.close()
            except (OSError, ValueError, EOFError):  # closed, detached, a full disk: as at exit
                pass


def leave_now(code: int) -> NoReturn:
    flush_files()
    os._exit(code & 0xFF)


def free_main(code: int) -> None:
    """After a script that ended well: its globals freed, as the interpreter's teardown frees
    a module's (``_name``s first), so that the ``__del__`` of what they held runs (a writer's
    last lines). Not after a failure (``RAISED``); within ``FREE_S``, or it leaves as it is."""
    if code or RAISED or not OWN:
        return
    timer = threading.Timer(FREE_S, leave_now, (code,))
    timer.daemon = True
    timer.start()
    for names in OWN:
        for private in (True, False):
            for name in list(names):
                if name != "__builtins__" and (name[:1] == "_" and name[:2] != "__") == private:
                    names[name] = None
    OWN.clear()
    gc.collect()
    timer.cancel()


if __name__ == "__main__":
    die_with_parent()  # the agent (torchjob.trainer.orphans)
    progress.start()  # its heartbeat, for the agent's hang watchdog (torchjob.trainer.progress)
    importlib.import_module("torchjob.trainer.collective_timeout").install()  # the job's default
    leave(main(sys.argv[1:]), free=True)

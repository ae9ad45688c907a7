"""A worker's error file (torchelastic's ``TORCHELASTIC_ERROR_FILE``), which its agent reads when
it fails: one torch cannot read is set aside, so that the agent goes on (``despite_unreadable``).
A worker stopped as it wrote one (torch's ``@record`` opens it, then writes) left it empty, and
json.load's error ended torch's agent with a traceback and no closing line. torchjob's own
workers write it whole or not at all (trainer.script.record).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from torch.distributed.elastic.multiprocessing.api import SubprocessContext
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

T = TypeVar("T")
SET_ASIDE = ".unreadable"  # the suffix an unreadable error file is renamed with
log = logging.getLogger("torch.distributed.elastic.agent.server.api")  # the agent's log


def unreadable(path: str) -> str | None:
    """Why torch cannot read the error file ``path``: what its own reader (ProcessFailure)
    raised; None: it can, or there is none (torch then reads none either)."""
    try:
        ProcessFailure(local_rank=0, pid=0, exitcode=1, error_file=path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None


def set_aside(paths: Iterable[str]) -> list[str]:
    """Each error file in ``paths`` that torch cannot read, renamed ``PATH.unreadable`` (its
    failure then reads as an exit without one); a line for each."""
    said = []
    for path in paths:
        if (why := unreadable(path)) is not None:
            try:
                os.replace(path, path + SET_ASIDE)
            except FileNotFoundError:  # gone since: torch reads no file
                pass
            said.append(f"a worker's error file was unreadable ({why}), as when the worker "
                        "was stopped while writing it: read as an exit without one "
                        f"({path}{SET_ASIDE})")
    return said


def despite_unreadable(look: Callable[[], T], pcontext: Callable[[], Any]) -> T:
    """``look()``, torch's look at its workers, again after setting aside each error file of
    ``pcontext()`` that it could not read (torch logs and raises what json.load raised). Only
    a SubprocessContext's (a script's workers): its look may be repeated. A
    MultiprocessContext (the built-in trainer's, whose files torchjob writes whole) reads the
    first failure's file after stopping the rest: a repeat would name a stopped rank."""
    while True:
        try:
            return look()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            context = pcontext()
            if not isinstance(context, SubprocessContext) or \
                    not (said := set_aside(context.error_files.values())):
                raise  # not an error file's
            for line in said:
                log.warning("torchjob: %s", line)


class NoUnreadableTraceback(logging.Filter):
    """Drops torch's "Failed to parse reply file" record (and its traceback): the agent sets
    the file aside and says so in one line (``despite_unreadable``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to parse reply file")


logging.getLogger("torch.distributed.elastic.multiprocessing.errors").addFilter(
    NoUnreadableTraceback())

"""Whole lines in the agent's log. torch's tail of a worker's log file prints whatever a read
returns, a line the worker has not ended yet included: a last line without its newline ran
into the next rank's line (under that rank's prefix, and out of ``logs --rank``), and a line
written in two parts got two prefixes. ``install`` puts a tail that prints whole lines only in
its place. Every rank's tail writes to the agent's one stdout: each line is written under one
lock, or a long one (a pipe takes 64 KiB at a time) was cut by another rank's line, and its
rest lost its prefix."""

from __future__ import annotations

import os
import time
from threading import Event, Lock
from typing import Callable, TextIO

MAX_PART = 1 << 16  # a longer unended line is printed as it is (with a newline): no buffer
_WRITING = Lock()  # one line at a time on the agent's stdout, whichever rank's


def tail_logfile(header: str, file: str, dst: TextIO, finished: Event, interval_sec: float,
                 log_line_filter: Callable[[str], bool] | None = None) -> None:
    """torch's ``tail_logfile`` (torch.distributed.elastic.multiprocessing.tail_log) in whole
    lines: an unended one waits for its end, or for the worker's (then it gets a newline)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    part = ""
    with open(file, errors="replace") as fp:  # torch's decoding; "\r" ends a line too
        while True:
            read = fp.readline()
            part += read
            if not part.endswith("\n") and len(part) < MAX_PART:
                if read:
                    continue  # its end may be there already
                if not finished.is_set():
                    time.sleep(interval_sec)
                    continue
                if not part:
                    break
            line, part = part if part.endswith("\n") else part + "\n", ""
            if log_line_filter and log_line_filter(line):
                with _WRITING:
                    dst.write(f"{header}{line}")


def install() -> None:
    """Whole lines from every worker's log this process tails (torch's TailLog)."""
    from torch.distributed.elastic.multiprocessing import tail_log

    setattr(tail_log, "tail_logfile", tail_logfile)

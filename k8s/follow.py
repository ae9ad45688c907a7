"""Following a job's logs while it runs (``torchjob run --to k8s``, ``torchjob logs -f``).

Each run of a pod's container (pod uid, restartCount) is streamed once, by a thread of its
own, into one queue; the job and its pods are read again every ``POLL_S`` and when a stream
ends, so later pods and restarts are followed too. Following ends when the job and every
stream have ended, or ``DRAIN_S`` after the job (docs/internals.md).
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Union

from torchjob.trainer.contract import LOG_PREFIX_RE, NODE_PREFIX

POLL_S = 2.0  # how often the job and its pods are read while following
DRAIN_S = 30.0  # after the job ended, how long its last streams may take to end


@dataclass(frozen=True)
class Run:
    """One run of a pod's container, whose log can be read now."""

    pod: str
    uid: str
    restarts: int
    node: int  # the pod's node rank: the label of its lines that carry no log prefix

    @property
    def key(self) -> tuple[str, int]:
        return self.uid, self.restarts


def node_rank(replica_type: str, index: int, has_master: bool) -> int:
    """A pod's node rank, as the operators number the nodes (``PET_NODE_RANK``): a
    PyTorchJob's Master 0 and Worker i i+1; a Worker-only (elastic) job's Worker i i (its
    agents' ranks come from the rendezvous, and their lines say so); a TrainJob's node pod
    its Job completion index."""
    return index + 1 if has_master and replica_type.lower() == "worker" else index


def labelled(node: int, line: str) -> str:
    """``line`` of a pod of node rank ``node`` as printed: a worker's with its own prefix,
    any other with ``[node N] ``."""
    return line if LOG_PREFIX_RE.match(line) else NODE_PREFIX.format(node=node) + line


# the kubelet's stamp before each line of a log read with ``timestamps=true`` (RFC 3339, with
# up to nine digits of a second, or none: Go's RFC3339Nano)
STAMP_RE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ?")


def unstamped(line: str) -> tuple[float | None, str]:
    """A line read with ``timestamps=true``: when it was written (seconds since the epoch)
    and its text; (None, line) where no stamp leads it."""
    found = STAMP_RE.match(line)
    if found is None:
        return None, line
    whole, fraction, zone = found.groups()
    try:
        when = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    except ValueError:  # 2026-13-45T...: not a stamp after all
        return None, line
    return when + float(f"0.{fraction or 0}"), line[found.end():]


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a byte stream cut anywhere (inside a line, inside a UTF-8 character),
    exactly as ``str.splitlines`` cuts the whole text."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        end = buffer.rfind(b"\n") + 1
        if end:
            yield from buffer[:end].decode("utf-8", errors="replace").splitlines()
            del buffer[:end]
    if buffer:
        yield from buffer.decode("utf-8", errors="replace").splitlines()


@dataclass(frozen=True)
class _Ended:
    """A reader's last message; ``again``: the log could not be read yet, try at next poll."""

    run: Run
    again: bool


Message = Union[str, _Ended, Exception]


def follow_runs(look: Callable[[], tuple[bool, list[Run]]],
           open_log: Callable[[Run], Iterable[bytes] | None],
           poll_s: float = POLL_S, drain_s: float = DRAIN_S) -> Iterator[str]:
    """Lines of every run, each labelled (``labelled``), as they are written. ``look()``: has
    the job ended (read BEFORE its pods, so that the runs it returns are the last ones), and
    its readable runs. ``open_log(run)``: the run's log as a byte stream that ends with the
    run, or None when it cannot be read yet. Errors of either are raised here."""
    out: queue.Queue[Message] = queue.Queue()
    stop = threading.Event()
    started: set[tuple[str, int]] = set()
    live = 0
    ended_at: float | None = None
    try:
        while True:
            if ended_at is None:
                ended, runs = look()
                ended_at = time.monotonic() if ended else None
                for run in runs:
                    if run.key not in started:
                        started.add(run.key)
                        live += 1
                        threading.Thread(target=_read, args=(run, open_log, out, stop),
                                         name=f"log {run.pod}", daemon=True).start()
            if ended_at is not None and live == 0:
                return
            deadline = time.monotonic() + poll_s if ended_at is None else ended_at + drain_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    message = out.get(timeout=left)
                except queue.Empty:
                    break
                if isinstance(message, str):
                    yield message
                elif isinstance(message, Exception):
                    raise message
                else:
                    live -= 1
                    if message.again:
                        started.discard(message.run.key)
                    else:
                        break  # a container ended: look at the job and its pods at once
            if ended_at is not None and time.monotonic() >= deadline:
                return  # DRAIN_S passed: leave the streams that did not end
    finally:
        stop.set()


def _read(run: Run, open_log: Callable[[Run], Iterable[bytes] | None],
          out: queue.Queue[Message], stop: threading.Event) -> None:
    try:
        chunks = open_log(run)
        if chunks is None:
            out.put(_Ended(run, again=True))
            return
        for line in split_lines(chunks):
            if stop.is_set():
                return
            out.put(labelled(run.node, line))
    except Exception as exc:  # handed to the generator, which raises it
        out.put(exc)
    out.put(_Ended(run, again=False))

"""``python -m torchjob.trainer.store --port PORT``: an elastic job's rendezvous store, in a
process of its own that no training node hosts, so that losing any node leaves the rendezvous.

Each backend starts it beside the nodes; every agent is its client (``is_host=false``). It
prints ``READY_LINE`` once it serves and exits 0 on SIGTERM or SIGINT. Why: docs/internals.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
from datetime import timedelta
from types import FrameType

from torchjob.trainer.contract import STORE_TIMEOUT_S

READY_LINE = "torchjob: rendezvous store serving on port {port}"


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchjob.trainer.store",
                                     description="the rendezvous store of an elastic job")
    parser.add_argument("--port", type=int, required=True, help="TCP port to serve on")
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    from torch.distributed import TCPStore

    try:
        # listens on every address; multi_tenant as the agents' clients open it
        store = TCPStore("0.0.0.0", args.port, is_master=True, wait_for_workers=False,
                         multi_tenant=True, timeout=timedelta(seconds=STORE_TIMEOUT_S))
    except (RuntimeError, ValueError) as exc:
        print(f"torchjob: the rendezvous store cannot serve on port {args.port}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    print(READY_LINE.format(port=args.port), flush=True)
    try:
        while True:
            signal.pause()
    finally:
        del store
    return 0  # pragma: no cover - signal.pause returns only through _stop


if __name__ == "__main__":
    sys.exit(main())

"""``torchjob run --to k8s`` against the pod emulator (``tests/k8s/pods.py``):

``python -m tests.k8s.pods_run [--claim NAME=DIR] [--grace S] [OPTIONS] JOB.yaml|SCRIPT.py ...``

runs the objects that command would submit (an elastic job's store too;
``torchjob.jobs.cli.requests``, nothing rebuilt), prints
the pods' logs labelled as ``torchjob logs`` does; Ctrl-C or SIGTERM deletes the
job; the exit code is the job's as the operator judges it from its containers (0, the failed
container's code, 143 when deleted after the pods checkpointed), for a failed job the agents'
own where one said it first-hand, as ``torchjob run --to k8s`` reads it. A PersistentVolumeClaim the
pods mount is the directory ``--claim`` gives it (relative: to where this runs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from torchjob.jobs import backend as registry
from torchjob.jobs.invocation import finish_target, requests, ship
from torchjob.jobs.parser import build_parser
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import SpecError, UserError
from tests.k8s.pods import GRACE_S, run
from torchjob.trainer.contract import EXIT_CONFIG, EXIT_FAILED

Obj = dict[str, Any]


def manifest(argv: list[str]) -> tuple[list[Obj], JobSpec]:
    """The objects ``torchjob run --to k8s ARGV`` would submit (the PyTorchJob, then an
    elastic job's rendezvous store), and its spec."""
    argv = ["run", "--to", "k8s", *argv]
    args = build_parser().parse_args(argv)
    finish_target(args, argv)
    (request,) = requests(registry.get("k8s"), args, fresh=True)
    assert request.spec is not None
    ship(request)  # a script or module job's workspace image, as torchjob run builds it
    return request.data, request.spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s.pods_run", description=__doc__,
                                     allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claim", action="append", default=[], metavar="NAME=DIR",
                        help="a PersistentVolumeClaim and the directory it is")
    parser.add_argument("--grace", type=float, default=GRACE_S)
    known, rest = parser.parse_known_args(argv)
    claims = {}
    for item in known.claim:
        name, _, folder = item.partition("=")
        claims[name] = Path(folder).resolve()
    try:
        job, _ = manifest(rest)
        code, _ = run(job, claims, grace=known.grace, out=sys.stdout)
    except (SpecError, UserError) as exc:
        print(f"torchjob: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except RuntimeError as exc:
        print(f"torchjob-pods: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return code


if __name__ == "__main__":
    sys.exit(main())

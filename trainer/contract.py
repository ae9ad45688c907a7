"""The constants every backend shares, defined once: exit codes, the log line prefix, the
CPU-thread rule. The trainer and the agent use them; the launcher side imports them from
here (this package is the lowest layer, and needs no torch for this module).
"""

from __future__ import annotations

import math
import re
import signal
import string
from collections.abc import Mapping

# The exit table (README, "Exit codes"), the same on every backend.
EXIT_OK = 0  # done
EXIT_FAILED = 1  # the job failed: user code raised, or workers kept dying past max_restarts
EXIT_CONFIG = 2  # bad configuration: spec, options or environment; never retried
EXIT_STOPPED = 143  # 128 + SIGTERM: stopped or preempted after a checkpoint; run again
# An agent lost the job's rendezvous store after it had met the other nodes there (its pod,
# process or node gone): not the job's fault, so retried like a lost node. >= 128 so that
# PyTorchJob's ExitCode policy recreates the pods (and docker's exit-code restart restarts the
# node) while the store comes back (a Deployment recreates it); the next attempt resumes from
# the last checkpoint. No signal gives it (128 + 1..64 ends at 192). A store never reached is
# a configuration problem, EXIT_FAILED.
EXIT_STORE_LOST = 200


def signal_of(exitcode: int) -> str | None:
    """The signal a process died of, by its exit code: ``-N`` (Popen's), or a shell's ``128+N``
    where N names a signal of this platform (255, ``sys.exit(-1)``, is no signal 127); None
    for an exit."""
    number = -exitcode if exitcode < 0 else exitcode - 128
    if exitcode >= 0 and number not in signal.valid_signals():
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"  # a real-time one, or -N of no signal at all
# What asks a worker to checkpoint and stop (Slurm's --signal and cancel, pod deletion, torchrun)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# what ps and top call the agent's fork server and the workers forked from it (/proc/PID/comm:
# the server is a fork of the agent, with its command line, and each worker a fork of the server)
SERVER_NAME, WORKER_NAME = "torchjob-server", "torchjob-worker"
# what stops a torchjob command in a terminal (`torchjob run`, a launcher): Ctrl-C, and SIGTERM
# (what ``torchjob cancel`` sends a launcher); the first stops the job, a second more firmly
COMMAND_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Between a worker and its agent only, never a job's exit code: the worker lost a peer (a
# collective failed because another process died or vanished), so a restart may help.
# sysexits' EX_TEMPFAIL, "a temporary failure: the user is invited to retry".
EXIT_RETRY = 75


def job_exit_code(codes: set[int]) -> int:
    """One exit code in the table from several (workers', nodes'): 0 when all are 0, 2 if
    any is a configuration error, 143 if all that failed stopped after a checkpoint, 200 if
    they lost the rendezvous store (some may have stopped after a checkpoint), else 1."""
    failed = codes - {EXIT_OK}
    if not failed:
        return EXIT_OK
    if EXIT_CONFIG in failed:
        return EXIT_CONFIG
    if failed == {EXIT_STOPPED}:
        return EXIT_STOPPED
    if EXIT_STORE_LOST in failed and failed <= {EXIT_STORE_LOST, EXIT_STOPPED}:
        return EXIT_STORE_LOST
    return EXIT_FAILED

def nodes_exit_code(codes: list[int], min_nodes: int) -> int:
    """The job's exit code from its nodes' (agents', containers'): 0 when at least ``min_nodes``
    (nnodes MIN) of them finished, as an elastic job does that completed after losing nodes;
    otherwise ``job_exit_code`` of the others (1 when there are none)."""
    if codes and sum(code == EXIT_OK for code in codes) >= min_nodes:
        return EXIT_OK
    return job_exit_code({code for code in codes if code != EXIT_OK} or {EXIT_FAILED})

# An agent's last line when the job failed (``torchjob.trainer.agent``): the first failing node and
# rank and why, the attempt and the job's exit code. Launchers find it in a node's output
# and end with it; a scheduler that reports no exit code (TorchX) takes the code from it.
CLOSING = "torchjob: the job failed: "
# What follows it on a node that only heard the verdict from the node where the failure began
# (``torchjob.trainer.torchrun_agent``): a launcher ends with the first-hand line.
HEARD_FAIL, HEARD_RESTART = "stopping: ", "another node: "
# The agent's line when its node acts on a hang (``torchjob.trainer.torchrun_agent``):
# HANG_LINE, the node, ": ", who is stuck and why, HANG_ACTION; ``torchjob status`` reads it.
HANG_LINE, HANG_ACTION = "torchjob: hang on node ", "; killing its workers"
CLOSING_RE = re.compile(re.escape(CLOSING) + f"(?P<heard>{re.escape(HEARD_FAIL)}|"
                        f"{re.escape(HEARD_RESTART)})?" + r"(?P<what>.*) \(attempt "
                        r"(?P<attempt>\d+), exit (?P<code>\d+)\)$")


# Node 0's agent's last line when the job finished: the attempt, the size, the restarts and
# every change of membership (torchjob.trainer.ledger); launchers find it in a node's output.
FINISHED = "torchjob: the job finished: "


def closing_line(why: str, attempt: int, code: int) -> str:
    """``torchjob: the job failed: node 0 rank 1 raised ValueError: x: not retried (...)
    (attempt 0, exit 1)``."""
    return f"{CLOSING}{why} (attempt {attempt}, exit {code})"

# Node 0's agent's count of a script's steps (torchjob.trainer.pace), said in its log every
# SAY_S there and when they end: ``torchjob status`` of a script where it reads the logs
# (Kubernetes, TorchX), as it reads RUN_DIR/progress.json elsewhere. COUNTED, the step, " of "
# the total when the script told it, ", " the pace " steps/s" once there is one.
COUNTED = "torchjob: steps counted: "
COUNTED_RE = re.compile(re.escape(COUNTED) + r"(?P<step>\d+)(?: of (?P<total>\d+))?"
                        r"(?:, (?P<pace>\d+(?:\.\d+)?(?:e[+-]\d+)?) steps/s)?$")  # .4g's forms


def counted_line(step: int, total: int | None, steps_per_s: float | None) -> str:
    """``torchjob: steps counted: 40 of 100, 2.5 steps/s`` (COUNTED_RE)."""
    return (f"{COUNTED}{step}" + (f" of {total}" if total else "")
            + (f", {steps_per_s:.4g} steps/s" if steps_per_s else ""))


def parse_counted(line: str) -> dict[str, float | None] | None:
    """The count a ``counted_line`` says wherever it ends ``line`` (``step``, ``total_steps``,
    ``steps_per_s``; None where it did not say one); None if it is not one."""
    found = COUNTED_RE.search(line.rstrip())
    if found is None:
        return None
    return {"step": int(found["step"]),
            "total_steps": int(found["total"]) if found["total"] else None,
            "steps_per_s": float(found["pace"]) if found["pace"] else None}


# One prefix for every log line a job prints, on every backend: node, rank, attempt.
LOG_PREFIX = "[node {node} rank {rank} attempt {attempt}] "
NODE_PREFIX = "[node {node}] "  # a node's own lines (its agent's, its pod's), on every backend


# Where a job's files go, told to every worker on every backend: user scripts read these
# (their argv is theirs alone); the built-in trainer also gets --run-dir and --checkpoint-dir.
RUN_DIR_ENV = "TORCHJOB_RUN_DIR"
CHECKPOINT_DIR_ENV = "TORCHJOB_CHECKPOINT_DIR"
# ``python -m torchjob.trainer.agent``'s own options for them (before torchrun's): the agent takes
# them off its command line and exports them to its workers.
RUN_DIR_OPTION, CHECKPOINT_DIR_OPTION = "--run-dir", "--checkpoint-dir"
DIR_OPTIONS = {RUN_DIR_OPTION: RUN_DIR_ENV, CHECKPOINT_DIR_OPTION: CHECKPOINT_DIR_ENV}
# How the job treats checkpoints it finds (trainer.fingerprint): the agent's --resume VALUE,
# exported as TORCHJOB_RESUME: force, or fresh:TOKEN (unset: resume when they match).
RESUME_OPTION, RESUME_ENV = "--resume", "TORCHJOB_RESUME"
# The hang watchdog (torchjob.trainer.hang): the agent's --hang-timeout SECONDS, exported as
# TORCHJOB_HANG_TIMEOUT (0: off). Its default, the spec's too, is justified in trainer/hang.py.
HANG_TIMEOUT_OPTION, HANG_TIMEOUT_ENV = "--hang-timeout", "TORCHJOB_HANG_TIMEOUT"
HANG_TIMEOUT_S = 180
MIN_HANG_TIMEOUT_S = 5  # a few heartbeats (torchjob.trainer.progress.BEAT_S): less would see ghosts
# The timeouts the job spec gives its workers (torchjob.jobs.timeouts orders them): a
# collective's wait before it fails (the built-in trainer's --pg-timeout default; a script's
# process-group default, trainer.collective_timeout) and a stop's step and checkpoint before the
# trainer exits without one (its --stop-grace default). The agent's option, exported as the
# variable; absent: the default here, which is the spec's.
COLLECTIVE_TIMEOUT_OPTION, COLLECTIVE_TIMEOUT_ENV = ("--collective-timeout",
                                                     "TORCHJOB_COLLECTIVE_TIMEOUT")
COLLECTIVE_TIMEOUT_S = 300  # above HANG_TIMEOUT_S, so that the watchdog sees a hang first
CHECKPOINT_BUDGET_OPTION, CHECKPOINT_BUDGET_ENV = ("--checkpoint-budget",
                                                   "TORCHJOB_CHECKPOINT_BUDGET")
CHECKPOINT_BUDGET_S = 30
STOP_GRACE_S = 60  # a stop signal -> the kill (K8s, docker, local): above CHECKPOINT_BUDGET_S
STORE_TIMEOUT_S = 60  # one request to the job's own rendezvous store (torchjob.trainer.store)
# NCCL's watchdog monitor (torch's TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC, default 480 s): the agent
# sets it for its workers this far above the collective timeout (at the default: torch's own)
NCCL_HEARTBEAT_ENV, NCCL_HEARTBEAT_MARGIN_S = "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", 180
AGENT_ENV_OPTIONS = {**DIR_OPTIONS, RESUME_OPTION: RESUME_ENV,
                     HANG_TIMEOUT_OPTION: HANG_TIMEOUT_ENV,
                     COLLECTIVE_TIMEOUT_OPTION: COLLECTIVE_TIMEOUT_ENV,
                     CHECKPOINT_BUDGET_OPTION: CHECKPOINT_BUDGET_ENV}
# Where each worker reports its progress (torchjob.trainer.progress): a node-local folder the agent
# makes, one small file per local rank; unset (not under our agent): reporting does nothing.
PROGRESS_DIR_ENV = "TORCHJOB_PROGRESS_DIR"
# The agent's storm guard (torchjob.trainer.ledger): restarts in a row that come back to the same
# checkpoint before the job is stopped as a restart storm; 0 turns it off.
MAX_STALLED_OPTION, MAX_STALLED_DEFAULT = "--max-stalled-restarts", 3
# the GPUs per node the job asked its scheduler or container engine for (resources.gpus): each
# agent checks it sees them before any worker starts (trainer.gpus.missing)
EXPECT_GPUS_OPTION = "--expect-gpus"

# A finished checkpoint's record (torchjob.trainer.checkpoint), also read before submitting
# (torchjob.jobs.preflight): step, world size, config and its fingerprint, a checksum per file.
MANIFEST = "manifest.json"

# The attempt of a node's first workers when the scheduler itself runs the job again (Slurm's
# requeue: SLURM_RESTART_COUNT): the agent adds its own restarts to it. Unset: 0.
ATTEMPT_BASE_ENV = "TORCHJOB_ATTEMPT_BASE"


def attempt_base(environ: Mapping[str, str]) -> int:
    """``TORCHJOB_ATTEMPT_BASE`` (0 when unset); a ValueError that names it unless >= 0."""
    raw = environ.get(ATTEMPT_BASE_ENV, "").strip() or "0"
    if not raw.isdigit():
        raise ValueError(f"{ATTEMPT_BASE_ENV}={raw!r} is not a whole number >= 0 (the attempt "
                         "the scheduler runs the job for: 0 the first time)")
    return int(raw)


def nccl_heartbeat_s(collective_s: float) -> int:
    """NCCL's watchdog heartbeat timeout for a collective timeout (whole seconds, as torch
    reads it): above it, so that a collective fails by its own timeout first."""
    return math.ceil(collective_s) + NCCL_HEARTBEAT_MARGIN_S


def seconds_from(environ: Mapping[str, str], name: str, default: float) -> float:
    """The positive seconds in ``environ[name]`` (``default`` when unset); a ValueError that
    names the variable otherwise."""
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:
        raise ValueError(f"{name}={raw!r}: give a number of seconds above 0")
    return value


def log_prefix(node: int | str, rank: int | str, attempt: int | str) -> str:
    """``[node 1 rank 3 attempt 0] ``: where a line came from."""
    return LOG_PREFIX.format(node=node, rank=rank, attempt=attempt)


# LOG_PREFIX as a pattern, made from it: a line's node, rank and attempt (each a number).
LOG_PREFIX_RE = re.compile("".join(
    re.escape(text) + (rf"(?P<{name}>\d+)" if name else "")
    for text, name, _, _ in string.Formatter().parse(LOG_PREFIX)))


def parse_log_prefix(line: str) -> tuple[int, int, int, str] | None:
    """(node, rank, attempt, the rest) of a line that starts with the log prefix; else None."""
    match = LOG_PREFIX_RE.match(line)
    if match is None:
        return None
    return (int(match["node"]), int(match["rank"]), int(match["attempt"]),
            line[match.end():])


# torchrun's --nproc-per-node words, which each node's agent turns into its own count when it
# starts (trainer.gpus.nproc_per_node); a job spec takes them as they are (jobs.checks)
NPROC_WORDS = ("gpu", "cpu", "auto")


def thread_env(node_cpus: float | None, nproc_per_node: int | None) -> dict[str, str]:
    """The thread settings every renderer gives the workers (``omp_threads``)."""
    return {"OMP_NUM_THREADS": str(omp_threads(node_cpus, nproc_per_node))}


def omp_threads(node_cpus: float | None, nproc_per_node: int | None) -> int:
    """CPU threads per worker: the node's CPUs shared by its worker processes, at least one.
    ``node_cpus`` or ``nproc_per_node`` None (unknown) gives one thread, which never
    oversubscribes."""
    if not node_cpus or not nproc_per_node:
        return 1
    return max(1, int(node_cpus // nproc_per_node))

"""``python -m torchjob.trainer.agent``, the entry point on every node: torchrun's arguments and
agent (trainer.torchrun_agent), with the built-in trainer's workers forked from a server that
has imported torch already, so that a restart costs a fork.

torchjob's options come first (``--retry-on-error``, ``--max-stalled-restarts`` and the
exported ``AGENT_ENV_OPTIONS``); with a run directory it holds its lock (trainer.runlock): a
second live run there exits 2.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import uuid
from types import FrameType
from collections.abc import Mapping
from typing import Any, NoReturn, Sequence

from torchjob.trainer import progress
from torchjob.trainer.contract import (AGENT_ENV_OPTIONS, CHECKPOINT_BUDGET_ENV,
                                       CHECKPOINT_BUDGET_OPTION, COLLECTIVE_TIMEOUT_ENV,
                                       COLLECTIVE_TIMEOUT_OPTION, COLLECTIVE_TIMEOUT_S,
                                       DIR_OPTIONS, EXIT_CONFIG, EXIT_FAILED, EXIT_STOPPED,
                                       EXPECT_GPUS_OPTION, HEARD_FAIL, attempt_base,
                                       EXIT_STORE_LOST, HANG_TIMEOUT_ENV, HANG_TIMEOUT_OPTION,
                                       HANG_TIMEOUT_S, MAX_STALLED_OPTION, MIN_HANG_TIMEOUT_S,
                                       NCCL_HEARTBEAT_ENV, PROGRESS_DIR_ENV,
                                       RUN_DIR_ENV, SERVER_NAME, STOP_SIGNALS, WORKER_NAME,
                                       closing_line, job_exit_code, nccl_heartbeat_s,
                                       seconds_from)
from torchjob.trainer.dirs import unusable
from torchjob.trainer.gpus import missing, nproc_per_node
from torchjob.trainer.orphans import die_with_parent, stop_when_orphaned
from torchjob.trainer.runlock import RunDirBusy, RunLock
from torchjob.trainer.script import exit_code, leave

FAST_MODULE = "torchjob.trainer"
# runs any other worker, as python would (trainer/script.py)
SCRIPT_MODULE = "torchjob.trainer.script"
RETRY_ON_ERROR = "--retry-on-error"  # ours, before torchrun's arguments: restart on exceptions
# ours too, each a whole number: the Agent keyword argument it sets
COUNT_OPTIONS = {MAX_STALLED_OPTION: "max_stalled_restarts", EXPECT_GPUS_OPTION: "gpus"}
# trainer.forkserver_guard first: the server dies with this agent (trainer.orphans);
# torch.optim imports torch._dynamo on first use
PRELOAD = ["torchjob.trainer.forkserver_guard", "torchjob.trainer.train", "torch._dynamo"]


def worker(*argv: str) -> None:
    """One training process, forked from the preloaded server; exits with the trainer's code, or
    143 for a stop signal after the last step (docs/internals.md).
    """
    for sig in STOP_SIGNALS:  # heard again (start_forkserver), before the name says "worker"
        signal.signal(sig, signal.SIG_DFL)  # (the agent kills one still named as the server)
    die_with_parent()  # the fork server, which dies with this agent (torchjob.trainer.orphans)
    name_process(WORKER_NAME)
    progress.start()  # the heartbeat, from the first moment (torchjob.trainer.progress)
    from torchjob.trainer.train import main

    try:
        code = main(list(argv), stopped_after_the_work=EXIT_STOPPED)
    except Exception as exc:
        from torchjob.trainer.script import failed

        code = failed(exc)
    if code:
        sys.exit(code)


def exit_at_once(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM while torch is being imported: nothing has started, so exit (128 + signal) at
    once. Not by raising SystemExit: raised at whatever line the imports had reached, it can be
    caught there (numpy's import catches it), and the agent then went on with modules half
    imported, which its fork server and workers inherited: the stop was lost, and the run
    failed at its end, in a worker's import of matplotlib."""
    os._exit(128 + signum)


def stop_as_torch_does(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM before torch's agent has its own handler: raise what that handler raises
    (``SignalException``), which torch's agent answers (it stops any workers and leaves the
    rendezvous open to the other nodes) and ``__main__`` turns into 128 + the signal."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    sig = signal.Signals(signum)
    raise SignalException(f"Process {os.getpid()} got signal: {sig}", sigval=sig)


def own_options(argv: list[str]) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """torchjob's options off the front of ``argv``, in any order: (torchrun's arguments, the
    agent's settings (``Agent``'s keyword arguments), the variables to export to the workers).
    A number that is not one: a ValueError that names the option."""
    settings: dict[str, Any] = {}
    env: dict[str, str] = {}
    while argv:
        if argv[0] == RETRY_ON_ERROR:
            settings["retry_on_error"], argv = True, argv[1:]
        elif argv[0] in AGENT_ENV_OPTIONS and len(argv) > 1:
            env[AGENT_ENV_OPTIONS[argv[0]]], argv = argv[1], argv[2:]
        elif argv[0] in COUNT_OPTIONS and len(argv) > 1:
            if not argv[1].isdigit():
                raise ValueError(f"{argv[0]} {argv[1]!r}: must be a whole number >= 0")
            settings[COUNT_OPTIONS[argv[0]]], argv = int(argv[1]), argv[2:]
        else:
            break
    return argv, settings, env


def hang_timeout(environ: dict[str, str]) -> float:
    """``--hang-timeout``'s seconds (``HANG_TIMEOUT_S`` when not given); a ValueError that
    says what is accepted."""
    raw = environ.get(HANG_TIMEOUT_ENV, str(HANG_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not (seconds == 0 or MIN_HANG_TIMEOUT_S <= seconds < float("inf")):
        raise ValueError(f"{HANG_TIMEOUT_OPTION} {raw!r}: give seconds, 0 (no watchdog) or at "
                         f"least {MIN_HANG_TIMEOUT_S}")
    return seconds


def job_timeouts(env: dict[str, str], environ: Mapping[str, str]) -> None:
    """Check ``--collective-timeout`` and ``--checkpoint-budget`` (a ValueError that names the
    option), and give the workers NCCL's watchdog heartbeat above the collective timeout
    unless ``environ`` (the job's env) sets it (torchjob.jobs.timeouts checks that one)."""
    for option, name in ((COLLECTIVE_TIMEOUT_OPTION, COLLECTIVE_TIMEOUT_ENV),
                         (CHECKPOINT_BUDGET_OPTION, CHECKPOINT_BUDGET_ENV)):
        try:
            seconds_from(env, name, 1)
        except ValueError:
            raise ValueError(f"{option} {env[name]!r}: give a number of seconds above 0") from None
    if NCCL_HEARTBEAT_ENV not in environ:
        collective = seconds_from(env, COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S)
        env[NCCL_HEARTBEAT_ENV] = str(nccl_heartbeat_s(collective))


def main(argv: Sequence[str] | None = None) -> None:
    """torchrun with torchjob's own options first (docs/internals.md)."""
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    try:
        argv, settings, env = own_options(list(sys.argv[1:] if argv is None else argv))
        seconds = hang_timeout(env)
        gpus = settings.pop("gpus", 0)  # checked here, not an Agent's setting
        job_timeouts(env, os.environ)
    except ValueError as exc:
        print(f"torchjob: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    for name in DIR_OPTIONS.values():  # a script that changes its directory (Hydra's
        if name in env:  # job.chdir) still finds them
            env[name] = os.path.abspath(env[name])
    os.environ.update(env)  # the workers inherit it (through the forkserver too)

    from torch.distributed.launcher import api as launcher_api
    from torch.distributed.run import get_args_parser

    from torchjob.trainer import loglines, stop_heard
    from torchjob.trainer.torchrun_agent import Agent

    loglines.install()  # whole lines under each rank's prefix

    signal.signal(signal.SIGTERM, stop_as_torch_does)  # torch's handler once workers start
    stop_heard.remember()  # never lost, even where what it raises is (trainer.stop_heard)
    stop_when_orphaned()  # a launcher killed outright: the job stops after a checkpoint
    # a stop raises from here on: what this agent makes, it makes inside the try that removes it
    progress_dir = own_log_dir = lock = None
    try:
        if seconds:  # node-local, one file per worker (torchjob.trainer.progress)
            progress_dir = tempfile.mkdtemp(prefix="torchjob-progress-")
            os.environ[PROGRESS_DIR_ENV] = progress_dir
        try:
            attempt_base(os.environ)
        except ValueError as exc:
            print(f"torchjob: {exc}", file=sys.stderr)
            sys.exit(EXIT_CONFIG)
        # launch_agent makes the agent: ours, with our settings
        launcher_api.LocalElasticAgent = functools.partial(  # type: ignore[misc, assignment]
            Agent, hang_timeout=seconds, progress_dir=progress_dir, **settings)
        parser = get_args_parser()
        # the script's own options are its own: torchrun's parser would take a script's --d
        # or --log for an ambiguous abbreviation of its --duplicate-*-filters or --log-dir and
        # stop the job (argparse sorts every word before REMAINDER takes the script's), as
        # bare torchrun does; the agent's command spells every option of torchrun's in full
        parser.allow_abbrev = False
        args = parser.parse_args(argv)
        args.nproc_per_node = node_gpus(args.nproc_per_node, gpus)
        own_log_dir = tee_to_us(args)
        lock = lock_run_dir(args, env)
        run_agent(args)
    finally:
        if lock is not None:
            lock.release()
        if own_log_dir is not None:
            shutil.rmtree(own_log_dir, ignore_errors=True)
        if progress_dir is not None:
            shutil.rmtree(progress_dir, ignore_errors=True)


def node_gpus(nproc: str, gpus: int) -> str:
    """``--nproc-per-node`` as a count (``gpus.nproc_per_node``), once this node is seen to
    have the ``--expect-gpus`` it asked for; else exit 2 with the closing line that says why,
    before any worker starts."""
    try:  # the GPUs asked for first: with none, ``gpu`` would say to ask for them
        problem = missing(gpus)
        if not problem:
            return nproc_per_node(nproc)
    except ValueError as exc:
        problem = str(exc)
    print(closing_line(problem, 0, EXIT_CONFIG), file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG)


def tee_to_us(args: Any) -> str | None:
    """Turn on torchrun's tee unless the command set ``--tee`` or ``--redirects``, so the
    workers' lines reach us to be prefixed; the log directory made for it, if one was."""
    own_log_dir = None
    if args.tee == "0" and args.redirects == "0":
        args.tee = "3"
        if args.log_dir is None:  # torch's default is a new /tmp/torchelastic_* left behind
            own_log_dir = args.log_dir = tempfile.mkdtemp(prefix="torchjob-agent-")
    # the tee's lines, each in one write, as they come (also without PYTHONUNBUFFERED)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    return own_log_dir


def lock_run_dir(args: Any, env: dict[str, str]) -> RunLock | None:
    """The run directory's lock, held (None without a run directory), once the run and
    checkpoint directories are usable; exit 2 with the closing line otherwise."""
    for option, name in DIR_OPTIONS.items():  # before any worker starts (torchjob.trainer.dirs)
        problem = unusable(env[name]) if name in env else None
        if problem is not None:
            print(closing_line(f"{option} {env[name]}: {problem}", 0, EXIT_CONFIG),
                  file=sys.stderr, flush=True)
            sys.exit(EXIT_CONFIG)
    if RUN_DIR_ENV not in env:
        return None
    lock = RunLock(env[RUN_DIR_ENV], lock_id(args), say=lambda line: print(
        line, file=sys.stderr, flush=True))
    try:
        lock.acquire()
    except RunDirBusy as exc:
        print(closing_line(str(exc), 0, EXIT_CONFIG), file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
    return lock


def lock_id(args: Any) -> str:
    """Who holds the run directory's lock (trainer.runlock): the run's rendezvous id, shared by
    its nodes and kept across restarts and requeues; a standalone agent is a run of its own."""
    from torch.distributed.run import parse_min_max_nnodes

    if args.standalone or args.rdzv_id == "none":  # torchrun's default id
        if not args.standalone and parse_min_max_nnodes(args.nnodes)[1] > 1:
            return f"static:{args.master_addr}:{args.master_port}"
        return f"standalone:{uuid.uuid4()}"
    return str(args.rdzv_id)


def run_agent(args: Any) -> None:
    """torchrun's run, or for this trainer the agent with preforked workers."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_min_max_nnodes, run

    if not (args.module and args.training_script == FAST_MODULE and not args.no_python):
        if not args.no_python:  # tells its agent how it failed; otherwise exactly as python
            args.training_script_args = [*(["-m"] if args.module else []),
                                         args.training_script, *args.training_script_args]
            args.training_script, args.module = SCRIPT_MODULE, True
        run(args)
        return
    single_static = (args.rdzv_backend == "static" and not args.rdzv_endpoint
                     and args.master_port is None and parse_min_max_nnodes(args.nnodes)[1] == 1)
    if args.standalone or single_static:  # as torchrun does: a private c10d store
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    if "OMP_NUM_THREADS" not in os.environ and args.nproc_per_node.isdigit() \
            and int(args.nproc_per_node) > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # torchrun's rule, which the server inherits
    start_forkserver()  # first: torch's LaunchConfig queries CUDA (its NUMA default)
    config, _, _ = config_from_args(args)
    config.start_method = "forkserver"
    elastic_launch(config=config, entrypoint=worker)(*args.training_script_args)


def start_forkserver() -> None:
    """Start the server the workers fork from (preloading ``PRELOAD``): forked from this agent,
    before anything here queries CUDA, and deaf to stop signals, which its workers hear again
    (``worker``; docs/internals.md)."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    # blocked, not ignored, meanwhile: a stop that comes now waits, and is heard here the
    # moment the server is forked (an ignored one was lost: the run went on to the end)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    spawn = multiprocessing.util.spawnv_passfds
    multiprocessing.util.spawnv_passfds = _fork_server  # type: ignore[assignment]
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        multiprocessing.util.spawnv_passfds = spawn
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def name_process(name: str) -> None:
    """This process's name (Linux: at most 15 bytes); nothing where that cannot be set."""
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)
    except OSError:
        pass


def _fork_server(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
    """``multiprocessing.util.spawnv_passfds`` for the fork server's start: the same command
    (``python -c CODE``, the server's ``main`` with its sockets' descriptors) run in a fork of
    this process instead of a new interpreter, with every other descriptor closed as there
    (above all this agent's end of the server's "alive" pipe, whose closing tells the server
    its clients are gone, and a run directory's lock)."""
    code = args[list(args).index("-c") + 1]
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        for sig in STOP_SIGNALS:  # deaf to them, then no longer blocked (start_forkserver)
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        name_process(SERVER_NAME)  # ps and top would show the agent's command line twice
        keep = sorted({0, 1, 2, *passfds})
        for low, high in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")]):
            os.closerange(low + 1, high)
        exec(code, {"__name__": "__mp_forkserver__"})  # returns when its clients are gone
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001 (said, then the server's exit code)
        import traceback
        traceback.print_exc()
    finally:
        os._exit(status)


def ended(exc: Exception) -> int | None:
    """The exit code for what ended torch's agent, said on stderr; None: not one of those."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError,
                                                          RendezvousConnectionError)

    from torchjob.trainer.torchrun_agent import Agent

    if isinstance(exc, RendezvousConnectionError):  # the store is gone (or never came)
        inner = exc.__cause__ or exc.__context__
        cause = (str(inner or exc).strip().splitlines() or [""])[0]  # not torch's C++ frames
        if Agent.met:  # it served this node's rendezvous, then went: retried (EXIT_STORE_LOST)
            why, code = (f"the rendezvous store was lost ({cause}): its process, pod "
                         "or node went away; not the job's fault: exit "
                         f"{EXIT_STORE_LOST} is retried, and the next attempt resumes from the "
                         "last checkpoint"), EXIT_STORE_LOST
        else:
            why, code = (f"the rendezvous store is unreachable ({cause}): it was "
                         "never reached (not started, or a wrong endpoint); the nodes cannot "
                         "meet without it"), EXIT_FAILED
        print(closing_line(why, attempt_base(os.environ), code), file=sys.stderr, flush=True)
        return code
    if isinstance(exc, RendezvousClosedError):  # another node's agent closed it as it ended
        why = (f"{HEARD_FAIL}the rendezvous was closed as this node joined it: another node had "
               "ended the job (its log says why)")
        attempt = attempt_base(os.environ) if Agent.started is None else Agent.started
        print(closing_line(why, attempt, EXIT_FAILED), file=sys.stderr, flush=True)
        return EXIT_FAILED
    if isinstance(exc, ChildFailedError):
        code = EXIT_STORE_LOST if Agent.store_lost else job_exit_code(
            {failure.exitcode for failure in exc.failures.values()})
        print(closing_line(*Agent.closing, code) if Agent.closing else exc, file=sys.stderr,
              flush=True)
        return code
    if isinstance(exc, SignalException):  # told to stop: the workers were asked to checkpoint
        return 128 + int(exc.sigval)
    return None


def run() -> int:
    """``main``'s exit code, as the interpreter would make it of how ``main`` ended."""
    try:
        main()
    except SystemExit as exc:
        return exit_code(exc)
    except Exception as exc:
        code = ended(exc)
        if code is None:
            import traceback
            traceback.print_exc()
            return 1
        return code
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_at_once)  # before importing torch (seconds)
    # Not through the interpreter's teardown: a daemon thread (c10d's keep-alive) may be in a
    # store call as the store's host goes; a teardown ends that thread as the call comes back
    # from C++, and the agent aborts (exit 134; 139 as a container's PID 1) (script.leave).
    leave(run())

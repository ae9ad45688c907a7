"""The ``torchjob`` command line's parser: every command, its arguments and their help."""

from __future__ import annotations

import argparse
from importlib import metadata
from typing import Any, NoReturn

from torchjob.trainer.contract import EXIT_CONFIG

class _Parser(argparse.ArgumentParser):
    """Options spelled in full: with abbreviations on, argparse sorts every word, a script's own
    too, and stops at one that abbreviates two of ours (a script's ``--n``: ``--nnodes`` or
    ``--name``?), though the script's words are its own (``rest``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        unknown = message.removeprefix("unrecognized arguments: ")
        if unknown != message:  # torchrun's own options, pasted from a torchrun command
            message = torchrun_only(unknown.split()) or message
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_PLACED = "each backend places the nodes and their rendezvous itself"
_LINES = ("every worker's lines reach you prefixed [node N rank R attempt A] and stay in the "
          "run's record (torchjob logs JOB --rank R)")
# torchrun's options that torchjob takes no word for, and why (torch.distributed.run)
TORCHRUN_ONLY = {
    **dict.fromkeys(("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
                     "--master-addr", "--master-port", "--node-rank", "--local-addr"),
                    f"{_PLACED} (spec: rdzv.backend, rdzv.port, rdzv.join_timeout)"),
    **dict.fromkeys(("--log-dir", "--tee", "-t", "--redirects", "-r", "--local-ranks-filter",
                     "--logs-specs", "--duplicate-stdout-filters",
                     "--duplicate-stderr-filters"), _LINES),
    **dict.fromkeys(("--monitor-interval", "--start-method", "--role", "--run-path",
                     "--event-log-handler", "--signals-to-handle",
                     "--numa-binding", "--virtual-local-rank"),
                    "torchjob's agent on each node sets it (docs/internals.md)"),
    "--no-python": "torchjob runs Python workers, a SCRIPT.py or -m MODULE, whose progress "
                   "its agent watches; run the Python command your program starts",
}


def torchrun_only(words: list[str]) -> str:
    """Why the unrecognized ``words`` are not torchjob's, where they are torchrun's options
    (pasted from a torchrun command); "" when none is."""
    by_reason: dict[str, list[str]] = {}
    rest = []
    for word in words:
        option = word.partition("=")[0]
        option = "--" + option[2:].replace("_", "-") if option.startswith("--") else option
        if option in TORCHRUN_ONLY:
            by_reason.setdefault(TORCHRUN_ONLY[option], []).append(option)
        else:
            rest.append(word)
    if not by_reason:
        return ""
    told = [f"{', '.join(options)} {'is' if len(options) == 1 else 'are'} torchrun's: {why}; "
            f"drop {'it' if len(options) == 1 else 'them'}" for why, options in by_reason.items()]
    return "; ".join(told + ([f"unrecognized arguments: {' '.join(rest)}"] if rest else []))


def version() -> str:
    try:
        return metadata.version("torchjob")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown"


BACKENDS_HELP = ("local | docker | slurm | slurm:sbatch | torchx | torchx:SCHEDULER | k8s | "
                 "k8s:trainjob")

TO_HELP = f"backend: {BACKENDS_HELP}"
VALIDATE_HELP = ("Check files without running anything: a job spec (loaded, and with --to "
                 "rendered for that backend), or for Kubernetes (the default) manifests of "
                 "any kind against the upstream CRDs, the operators' admission rules and Pod "
                 "Security \"restricted\".")
SubParsers = argparse._SubParsersAction  # what add_subparsers returns


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; ``args.command`` names the command to run."""
    parser = _Parser(prog="torchjob", description="Run one PyTorch distributed training job "
                     "from one YAML job spec:\non this machine, in containers, on Slurm or on "
                     "Kubernetes.", epilog="examples:\n"
                     "  torchjob run jobs/examples/default.yaml\n"
                     "  torchjob run --nproc-per-node 2 train.py --lr 0.1   # no YAML needed\n"
                     "  torchjob run jobs/examples/default.yaml --set trainer.args.epochs=3\n"
                     "  torchjob render --to slurm jobs/examples/elastic.yaml\n"
                     "  torchjob submit --to slurm jobs/examples/default.yaml   # prints "
                     "slurm:JOB_ID\n"
                     "  torchjob status slurm:JOB_ID\n\n"
                     f"backends: {BACKENDS_HELP}\n"
                     "exit codes: 0 done, 1 the job failed, 2 bad configuration, 143 stopped "
                     "after a checkpoint\n(run again to resume from the last checkpoint)",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"torchjob {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_job_commands(sub)
    add_handle_commands(sub)
    add_other_commands(sub)
    return parser


def spec_command(sub: SubParsers, name: str, help: str,
                 default_to: str | None) -> argparse.ArgumentParser:
    """A command that takes a job: a spec file, or a script or module and its arguments."""
    cmd = sub.add_parser(name, help=help, description=help,
                         usage=f"torchjob {name} [OPTIONS] JOB.yaml [OPTIONS]\n"
                               f"       torchjob {name} [OPTIONS] SCRIPT.py [ARGS...]\n"
                               f"       torchjob {name} [OPTIONS] -m MODULE [ARGS...]")
    cmd.add_argument("target", metavar="JOB.yaml | SCRIPT.py",
                     help="a job spec file, or a training script (or with -m a module) "
                          "that every worker runs, as torchrun does")
    cmd.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARGS",
                     help="after a script or module: its own arguments, exactly as given")
    cmd.add_argument("-m", "--module", action="store_true",
                     help="TARGET is a Python module, run as python -m MODULE (torchrun -m)")
    cmd.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                     metavar="N", help="worker processes per node, or as torchrun takes it "
                     "gpu, cpu or auto, counted on each node (spec: nproc_per_node)")
    cmd.add_argument("--nnodes", metavar="N|MIN:MAX",
                     help="nodes, or a range for an elastic job (spec: nnodes)")
    cmd.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", metavar="N",
                     help="restarts of the worker group (spec: max_restarts)")
    cmd.add_argument("--name", help="the job's name (spec: name; default: the script's)")
    cmd.add_argument("--standalone", action="store_true",
                     help="accepted as torchrun takes it: a one-node job always has its "
                          "own rendezvous")
    cmd.add_argument("--save-spec", metavar="FILE",
                     help="write the job spec this command runs to FILE (YAML; "
                          "torchjob run FILE runs it again)")
    cmd.set_defaults(parser=cmd)
    cmd.add_argument("--to", default=default_to, required=default_to is None,
                     metavar="BACKEND", help=TO_HELP + (f" (default: {default_to})"
                                                        if default_to else ""))
    cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a spec field, e.g. --set nnodes=1:2 or "
                          "--set trainer.args.epochs=3 (repeatable; value is YAML)")
    cmd.add_argument("--fresh", action="store_true",
                     help="start over: checkpoints already in the checkpoint directory "
                          "are moved aside (never deleted), once; restarts of this job "
                          "resume its own")
    cmd.add_argument("--resume", choices=["force"],
                     help="force: resume the checkpoints even though they were written "
                          "with another configuration")
    return cmd



def sweep_option(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--sweep", action="append", default=[], metavar="ARG=V1,V2",
                     help="a job per value of a trainer argument (repeatable: the grid "
                          "of all); a job array on Slurm")



def add_job_commands(sub: SubParsers) -> None:
    """run, render, submit."""
    run = spec_command(sub, "run", "start the job, follow its logs, exit with its exit code",
                       "local")
    run.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    run.add_argument("--grace", type=float, metavar="SECONDS",
                     help="after Ctrl-C/SIGTERM, how long workers may take to checkpoint "
                          "before they are killed (local, docker, torchx:local_cwd and "
                          "torchx:local_docker; default: the spec's stop_grace, itself above "
                          "its checkpoint_budget)")
    render = spec_command(sub, "render", "print exactly what would be run or submitted (pure: "
                          "starts nothing)", "local")
    sweep_option(render)
    submit = spec_command(sub, "submit", "submit the job and print its handle (BACKEND:ID)", None)
    submit.add_argument("--dry-run", action="store_true", help="print what would be submitted "
                        "(the same as render)")
    sweep_option(submit)


def add_handle_commands(sub: SubParsers) -> None:
    """status, logs, cancel: of a job by its handle."""
    for name, help in (("status", "show a submitted job's state"),
                             ("logs", "print a job's logs, per node, rank and "
                              "attempt"),
                             ("cancel", "cancel a job (it checkpoints and exits "
                              "143)")):
        cmd = sub.add_parser(name, help=help, description=help)
        cmd.add_argument("job_id", metavar="JOB", help="the handle torchjob submit printed "
                         "(BACKEND:ID, e.g. slurm:1234), or an ID with --to")
        cmd.add_argument("--to", metavar="BACKEND", help=TO_HELP + " (when JOB is a bare ID)")
        if name == "status":
            cmd.add_argument("--json", action="store_true", help="print it as JSON (keys "
                             "state, step, total_steps, eta, ...)")
            cmd.add_argument("-w", "--watch", action="store_true", help="keep showing it "
                             "until the job ends (in place on a terminal)")
        if name == "logs":
            cmd.add_argument("-f", "--follow", action="store_true",
                             help="keep printing new lines until the job ends")
            cmd.add_argument("--rank", type=int, metavar="R",
                             help="only the lines of global rank R")
            cmd.add_argument("--tail", type=int, metavar="N",
                             help="only the last N lines (with -f: then the new ones)")
            cmd.add_argument("--log-dir", metavar="DIR", help="where the job wrote its logs, "
                             "once its backend has forgotten it (slurm: the run directory or "
                             "RUN_DIR/submitit/JOB_ID)")


def add_other_commands(sub: SubParsers) -> None:
    """list, validate, report."""
    lister = sub.add_parser("list", help="list jobs (every backend that can list here, or "
                            "those given with --to)", description="list jobs")
    lister.add_argument("--to", action="append", metavar="BACKEND", help=TO_HELP)
    lister.add_argument("--json", action="store_true", help="print them as JSON")
    lister.add_argument("-v", "--verbose", action="store_true",
                        help="also say why a backend that is not set up here was not listed")
    check = sub.add_parser("validate", help="check job specs, and Kubernetes manifests against "
                           "the upstream CRDs, admission rules and Pod Security 'restricted'",
                           description=VALIDATE_HELP)
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="job specs or manifest files ('-': stdin)")
    check.add_argument("--to", metavar="BACKEND",
                       help="a job spec: also render it for this backend; manifests: whose "
                            "files these are (default: k8s)")
    check.add_argument("--no-pod-security", action="store_true",
                       help="skip the Pod Security 'restricted' rules")
    report = sub.add_parser("report", help="write a run's report: one HTML file with its "
                            "curves, step times per rank, restarts and hangs, spec",
                            description="Write one self-contained HTML page (no network) of "
                            "a run: loss and evaluation curves, each rank's step time over "
                            "time, the rounds, restarts and hangs (with links to the stacks), "
                            "and the run's spec and environment.")
    report.add_argument("run", metavar="RUN", help="the run directory (e.g. runs/NAME), or a "
                        "job's handle (local:RUN_ID) whose backend knows it")
    report.add_argument("-o", "--output", metavar="FILE",
                        help="where to write it (default: RUN/report.html)")

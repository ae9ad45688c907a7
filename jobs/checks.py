"""Checks of single job-spec values: ``(value, field path) -> None``, or a SpecError that names
the value and the fix. Each is the ``check`` of a field in ``jobs.spec``."""

from __future__ import annotations

import math
import re

from torchjob.jobs.values import (DNS_1123_LABEL, DNS_1123_SUBDOMAIN, DNS_LABEL_MAX,
                                  DNS_SUBDOMAIN_MAX, Check, at_least, bad, env_name, kind,
                                  one_line, path_line, pattern, system_dir)
from torchjob.trainer.contract import HANG_TIMEOUT_S, MIN_HANG_TIMEOUT_S
from torchjob.trainer.contract import NPROC_WORDS as AGENT_NPROC_WORDS

# Worker processes per node: one per GPU (8 on most nodes) or per CPU core for CPU training
# (the largest nodes have a few hundred cores).
MAX_NPROC_PER_NODE = 256


def optional(check: Check) -> Check:
    """``check``, or nothing for an unset (None) value."""
    return lambda value, path: None if value is None else check(value, path)


def flags(value: tuple[str, ...], path: str) -> None:
    for i, flag in enumerate(value):
        one_line(flag, f"{path}[{i}]")
        if not flag.startswith("-"):
            raise bad(f"{path}[{i}]", flag, "is not an option: write it as on the command line, "
                      "e.g. --gres=gpu:1")


def mount_source(value: str, path: str) -> None:
    path_line(value, path)
    if ":" in value or "," in value:
        raise bad(path, value, "must not contain ':' or ',' (a host path or a volume/PVC name)")


def mount_target(value: str, path: str) -> None:
    mount_source(value, path)
    if not value.startswith("/") or value == "/":
        raise bad(path, value, "is not an absolute path inside the container (e.g. /data)")
    found = system_dir(value)
    if found is not None:
        raise bad(path, value, f"is the container's system directory {found} once normalised: "
                  "a mount there hides the image's own; mount at a directory of your own "
                  "(e.g. /data)")


def own_dir(value: str, path: str) -> None:
    """run_dir, checkpoint_dir: written by the job, so never a system directory (an absolute
    one here; a relative one is resolved where the job starts, torchjob.jobs.hosts)."""
    path_line(value, path)
    found = system_dir(value)
    if found is not None:
        raise bad(path, value, f"is the system directory {found}: no job may write into it; "
                  "use a directory of your own (e.g. runs/NAME or /data/NAME)")


def image(value: str, path: str) -> None:
    if not value or len(value) > 512 or any(c.isspace() or not c.isprintable() for c in value):
        raise bad(path, value, "is not an image reference (e.g. localhost/torchjob:latest)")


def script(value: str, path: str) -> None:
    path_line(value, path)
    if value.startswith("-"):
        raise bad(path, value, "starts with '-', so torchrun would read it as an option: "
                  "write ./" + value)


def nproc(value: int | str, path: str) -> None:
    if isinstance(value, str):  # a word each node counts (parse_nproc)
        return
    at_least(1)(value, path)
    if value > MAX_NPROC_PER_NODE:
        raise bad(path, value, f"is more than {MAX_NPROC_PER_NODE} (MAX_NPROC_PER_NODE): a node "
                  "runs one worker process per GPU or CPU core")


def hang_timeout(value: float, path: str) -> None:
    if not (value == 0 or MIN_HANG_TIMEOUT_S <= value < math.inf):
        raise bad(path, value, f"must be 0 (no hang watchdog) or at least {MIN_HANG_TIMEOUT_S} "
                  f"seconds (e.g. {HANG_TIMEOUT_S})")


def seconds(value: float, path: str) -> None:
    if not 0 < value < math.inf:
        raise bad(path, value, "must be a number of seconds above 0 (e.g. 60)")


def resume(value: str, path: str) -> None:
    if value in ("auto", "force", "fresh") or re.fullmatch(r"fresh:[A-Za-z0-9._-]{1,120}", value):
        return
    raise bad(path, value, "must be auto, force or fresh (torchjob run --fresh, --resume=force)")


def env_names(value: tuple[str, ...], path: str) -> None:
    for i, name in enumerate(value):
        env_name(name, f"{path}[{i}]")


dns_label = pattern(DNS_1123_LABEL, "a Kubernetes name (lower case letters, digits, '-')",
                    "team-a", DNS_LABEL_MAX)
dns_name = optional(pattern(DNS_1123_SUBDOMAIN, "a Kubernetes object name (lower case "
                            "letters, digits, '-' and '.')", "my-secret", DNS_SUBDOMAIN_MAX))


EXPORTER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")


def exporters(value: tuple[str, ...], path: str) -> None:
    """Each item ``pkg.module:Class``, as the trainer's --exporters takes it."""
    for i, item in enumerate(value):
        if not isinstance(item, str) or len(item) > 200 or not EXPORTER.fullmatch(item):
            raise bad(f"{path}[{i}]", item, "is not 'pkg.module:Class' (a module path, a "
                      "colon, an exporter class in it; e.g. "
                      "torchjob.jobs.examples.mlflow_exporter:MLflowExporter)")


def prometheus_dir(value: str, path: str) -> None:
    if value:
        own_dir(value, path)


# ------------------------------------------------------------------ GPUs and processes

# torchrun's --nproc-per-node words (the contract's, in its order), each for a person
NPROC_WORDS = dict(zip(AGENT_NPROC_WORDS, (
    "one process per GPU", "one process per CPU",
    "one process per GPU, or per CPU where the node has no GPU")))
_NPROC_FIX = f"(write a count, e.g. 2, or one of torchrun's words: {', '.join(NPROC_WORDS)})"


def parse_nproc(raw: object, path: str) -> int | str:
    """``nproc_per_node`` as torchrun's ``--nproc-per-node`` takes it: a count, or a word
    (``NPROC_WORDS``) that each node turns into its own count when it starts."""
    text = raw.strip() if isinstance(raw, str) else None
    if text in NPROC_WORDS:
        return text
    if text is not None and text.isascii() and text.isdigit():
        return int(text)  # as a PyTorchJob writes it: nprocPerNode: "4"
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise bad(path, raw, f"is {kind(raw)}, but a process count is expected {_NPROC_FIX}")
    return raw


def gpu_layout(nproc: int | str, gpus: int, builtin: bool) -> None:
    """``nproc_per_node`` against ``resources.gpus`` (GPUs per node), as torchrun users expect:
    one worker process per GPU (``--nproc-per-node gpu``; LOCAL_RANK picks the device). More
    processes than GPUs put two ranks on one GPU, which NCCL refuses ("Duplicate GPU
    detected"), as ``cpu`` may; fewer leave GPUs idle, unless each process drives the same
    number of GPUs itself (a script or module doing model parallelism in-process: gpus a
    multiple of nproc_per_node). The built-in trainer drives one GPU per process."""
    if not gpus or nproc in ("gpu", "auto"):  # one per GPU of the node: the GPUs it asks for
        return
    fix = f"set nproc_per_node: {gpus} (one process per GPU)"
    if nproc == "cpu":
        raise bad("nproc_per_node", nproc, f"starts one process per CPU, but the job asks for "
                  f"{gpus} GPU(s) per node (resources.gpus): ranks would share a GPU, which "
                  "NCCL refuses; set nproc_per_node: gpu (one process per GPU)")
    assert isinstance(nproc, int)
    if nproc > gpus:
        raise bad("nproc_per_node", nproc, f"is more than resources.gpus ({gpus}): two ranks "
                  f"would share a GPU, which NCCL refuses; {fix}, or ask for more GPUs")
    if builtin and nproc != gpus:
        raise bad("nproc_per_node", nproc, f"is fewer than resources.gpus ({gpus}): the "
                  f"built-in trainer drives one GPU per process (cuda:LOCAL_RANK), so "
                  f"{gpus - nproc} GPU(s) per node would sit idle; {fix}, or ask for fewer GPUs")
    if gpus % nproc:
        raise bad("nproc_per_node", nproc, f"does not divide resources.gpus ({gpus}): the "
                  f"processes of a node cannot drive equal shares of its GPUs; {fix}, or a "
                  f"divisor of {gpus} when each process drives several GPUs itself")


def gpus_asked(nproc: int | str, gpus: int, backend: str) -> None:
    """On a backend whose nodes get only the GPUs the job asks for (a scheduler's, a
    container's), ``nproc_per_node: gpu`` needs ``resources.gpus``: none would be there."""
    if nproc == "gpu" and not gpus:
        raise bad("nproc_per_node", nproc, f"starts one process per GPU, but the job asks "
                  f"{backend} for no GPU (resources.gpus: 0), so its nodes would have none: "
                  "set resources.gpus to the GPUs per node, or nproc_per_node to a count")

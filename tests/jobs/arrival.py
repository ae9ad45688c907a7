"""What a node's process receives from each backend's rendered request: its argv and the
job's env, after every expansion on the way (compose interpolation, TorchX macros, the
kubelet's ``$(VAR)``, bash). Shared by the hostile-input tests.

Expansions are EMULATED where the real thing cannot run here: compose's interpolation
(``interpolate``; podman-compose is not installed) and the kubelet's (``tests.k8s.kubelet``);
TorchX's macro substitution is TorchX's own (``macros.Values.apply``); shell lines run in a
real bash with harmless stubs for ``python`` and ``srun`` that only print their arguments, so a
user value that escapes its quoting runs (and leaves a marker file), and the test sees it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from torchx import specs

from torchjob.jobs.backend import Request
from tests.k8s.kubelet import Everything, expand

MARKER = "pwned"  # a file a hostile value tries to create in the working directory
Arrival = tuple[list[str], dict[str, str]]  # argv of the agent (from python on), env

_COMPOSE_VAR = re.compile(r"\$(?:(?P<escaped>\$)|(?P<named>[_A-Za-z][_A-Za-z0-9]*)"
                          r"|\{(?P<braced>[^}]*)\}|(?P<invalid>))")
_BRACED = re.compile(r"([_A-Za-z][_A-Za-z0-9]*)(?:(:?[-?+])(.*))?", re.DOTALL)


def interpolate(text: str, env: Mapping[str, str] = Everything()) -> str:
    """Compose-spec interpolation (EMULATED, the rule of compose-go's template package):
    ``$$`` is ``$``; ``$NAME`` and ``${NAME}`` are the variable, ``${NAME:-default}`` its
    default when unset; a ``$`` before anything else is an error. ``env`` defines every
    variable by default, so that a user's ``$X`` left unescaped shows."""
    def one(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        if match["named"]:
            return env[match["named"]]
        braced = _BRACED.fullmatch(match["braced"] or "")
        if match["invalid"] is not None and match["braced"] is None or not braced:
            raise ValueError(f"invalid interpolation format in {text!r}")
        name, op, default = braced.groups()
        if op in (":-", "-") and name == "TORCHJOB_HOST_DIR":  # the renderer's own
            return default
        return env[name]
    return _COMPOSE_VAR.sub(one, text)


# Harmless stand-ins, exported so that child shells (srun's bash -c, job.sh) have them too:
# python prints its argv and environment, srun runs its command here, the rest do nothing.
# python's two files get their names only when both are whole: the script may kill a python
# it started in the background (an elastic job's store: `kill %1`) halfway through.
STUBS = """
python() { local f; f=$(mktemp part.XXXXXX); printf '%s\\0' python "$@" > "$f"
           env -0 > "$f.env"; mv "$f.env" "environ.${f#part.}"; mv "$f" "words.${f#part.}"; }
srun() { while [ "$1" != bash ]; do
           case $1 in --export=*) printf %s "${1#--export=ALL,}" > export;; esac; shift
         done; "$@"; }
scontrol() { echo h; }
scancel() { :; }
export -f python srun scontrol scancel
"""


STORE = b"python\0-m\0torchjob.trainer.store\0"


def _bash(script: str, cwd: Path, env: Mapping[str, str] = {}) -> Arrival:
    """Run ``script`` in bash (from ``cwd``) with the harmless STUBS; what ``python`` got.
    Every node's python must have got the same."""
    for path in [*cwd.glob("words.*"), *cwd.glob("environ.*"), *cwd.glob("part.*"),
                 cwd / "job.sh", cwd / "export"]:
        path.unlink(missing_ok=True)
    (cwd / "job.sh").write_text(script)
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", STUBS + "bash job.sh"],
                          cwd=cwd, env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=30)
    assert not (cwd / MARKER).exists(), f"a user value ran a command: {script}"
    runs = sorted(cwd.glob("words.*"))
    assert proc.returncode == 0 and runs, (proc.stderr[-3000:], script)
    seen = {(path.read_bytes(), Path(str(path).replace("words", "environ")).read_bytes())
            for path in runs}
    # an elastic job's rendezvous store (trainer.store) is a python of its own: no user value
    seen = {item for item in seen if not item[0].startswith(STORE)} or seen
    assert len({argv for argv, _ in seen}) == 1, seen
    argv, environ = seen.pop()
    pairs = [item.partition("=") for item in environ.decode().split("\0")[:-1]]
    return argv.decode().split("\0")[:-1], {name: value for name, _, value in pairs}


def bash_syntax(script: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr


def _local(request: Request, cwd: Path) -> Arrival:
    bash_syntax(request.text)
    return _bash(request.text, cwd)


SLURM_ENV = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "h", "SLURM_JOB_NUM_NODES": "1",
             "SLURM_JOB_NODELIST_HET_GROUP_0": "h", "SLURMD_NODENAME": "h"}


def _sbatch(request: Request, cwd: Path) -> Arrival:
    """The whole batch script, run here (run_dir must lie under ``cwd``)."""
    bash_syntax(request.text)
    return _bash(request.text, cwd, SLURM_ENV)


def _torchx_script(args: list[str], env: dict[str, str], cwd: Path) -> Arrival:
    """A TorchX role's ``bash -c SCRIPT``, run with rank 0's host set; the role's env."""
    assert args[-2] == "-c", args
    argv, _ = _bash(args[-1], cwd, {"TORCHX_RANK0_HOST": "h"})
    return argv, env


def _torchx_appdef(request: Request, cwd: Path) -> Arrival:
    (role,) = request.data.roles
    role = specs.macros.Values(img_root="", app_id="APP", replica_id="0",
                               rank0_env="TORCHX_RANK0_HOST").apply(role)
    return _torchx_script(["bash", *role.args], dict(role.env), cwd)


def _torchx_local(request: Request, cwd: Path) -> Arrival:
    param = request.data.request.role_params["trainer"][0]
    return _torchx_script(param.args, dict(param.env), cwd)


def _torchx_slurm(request: Request, cwd: Path) -> Arrival:
    """TorchX's own batch script, run whole; env from its ``srun --export=ALL,...``."""
    script = request.data.request.materialize()
    bash_syntax(script)
    argv, _ = _bash(script, cwd, SLURM_ENV)
    pairs = (cwd / "export").read_bytes().decode().split(",")  # no newline translation
    return argv, {name: value for name, _, value in (pair.partition("=") for pair in pairs)}


def _container(container: Mapping[str, Any], cwd: Path) -> Arrival:
    """A pod's container as the kubelet starts it: command and env values expanded."""
    seen = Everything()
    words = [expand(word, seen) for word in container["command"]]
    env = {e["name"]: expand(e["value"], seen) for e in container.get("env", [])
           if "value" in e}
    if words[:2] == ["bash", "-c"]:
        return _torchx_script(words, env, cwd)
    return words, env


def _torchx_kubernetes(request: Request, cwd: Path) -> Arrival:
    job = yaml.safe_load(str(request.data.request))
    return _container(job["spec"]["tasks"][0]["template"]["spec"]["containers"][0], cwd)


def _k8s(request: Request, cwd: Path) -> Arrival:
    obj = request.data[0]  # the job; an elastic PyTorchJob's store objects follow it
    if obj["kind"] == "TrainJob":
        return _container(obj["spec"]["trainer"], cwd)
    replica = next(iter(obj["spec"]["pytorchReplicaSpecs"].values()))
    return _container(replica["template"]["spec"]["containers"][0], cwd)


def _docker(request: Request, cwd: Path) -> Arrival:
    service = yaml.safe_load(request.text)["services"]["node0"]
    return ([interpolate(word) for word in service["command"]],
            {k: interpolate(v) for k, v in service["environment"].items() if v is not None})


READERS = {"local": _local, "docker": _docker, "slurm": _sbatch, "slurm:sbatch": _sbatch,
           "torchx": _torchx_appdef, "torchx:local_cwd": _torchx_local,
           "torchx:slurm": _torchx_slurm, "torchx:kubernetes": _torchx_kubernetes,
           "k8s": _k8s, "k8s:trainjob": _k8s}


def arrival(request: Request, cwd: Path) -> Arrival:
    """(argv from ``python`` on, env) as a node's agent receives them from ``request``."""
    argv, env = READERS[request.backend](request, cwd)
    if "python" in argv:
        argv = argv[argv.index("python"):]
    return argv, env

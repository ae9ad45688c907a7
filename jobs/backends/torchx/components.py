"""TorchX components for torchjob (``torchx run jobs/backends/torchx/components.py:train``): a
JobSpec built by the spec loader, rendered as ``torchjob render --to torchx`` renders it."""

import os
import re
from typing import Dict, List, Optional

import torchx.specs as specs

from torchjob.jobs.load import build
from torchjob.jobs.backends.torchx.render import render_appdef


def train(
    *script_args: str,
    j: str = "1x2",
    m: Optional[str] = None,
    script: Optional[str] = None,
    image: str = "localhost/torchjob:latest",
    name: str = "torchjob",
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    mounts: Optional[List[str]] = None,
    max_retries: int = 0,
    max_restarts: int = 3,
    rdzv_port: int = 29400,
) -> specs.AppDef:
    """Train with torchjob's trainer (or your module or script) on every node, elastic-ready.

    Args:
        script_args: arguments for the module, e.g. --epochs 12 (python -m torchjob.trainer --help)
        j: [MIN:]MAXxNPROC: nodes (a MIN:MAX range for an elastic job) x processes per node
        m: the Python module every worker runs (default: trainer, torchjob's trainer)
        script: a Python script every worker runs instead of a module (path where it runs)
        image: container image (ignored by local_cwd)
        name: job name: lower case letters, digits and '-', starting with a letter
        cpu: CPUs per node
        gpu: GPUs per node
        memMB: memory per node in MiB
        h: a registered named resource (takes precedence over cpu, gpu and memMB)
        env: environment variables, e.g. A=1,B=2
        mounts: type=bind,src=/host,dst=/job[,readonly] or type=volume,src=pvc,dst=/job
        max_retries: how often the scheduler may retry the whole app
        max_restarts: how often the agent restarts the worker group after a failure
        rdzv_port: c10d rendezvous port on the rank-0 host (multi-node only)
    """
    match = re.fullmatch(r"(?:(\d+):)?(\d+)x(\d+)", j)
    if not match:
        raise ValueError(f"-j {j!r}: write [MIN:]MAXxNPROC, e.g. 2x2 or 1:4x8")
    low, high, nproc = match.groups()
    if m is not None and script is not None:
        raise ValueError(f"-m {m} and --script {script}: a worker runs one of them, give one")
    trainer: Dict[str, object] = {"script": script} if script is not None else \
        {"module": m or "torchjob.trainer"}
    data = {
        "name": name, "image": image, "nnodes": f"{low}:{high}" if low else int(high),
        "nproc_per_node": int(nproc), "max_restarts": max_restarts,
        "resources": {"cpu": cpu, "memory": f"{memMB}Mi", "gpus": gpu},
        "env": dict(env or {}), "mounts": spec_mounts(mounts or []),
        "rdzv": {"port": rdzv_port}, "trainer": trainer,
    }
    # the scheduler is unknown here (Kubernetes or not): env goes into the script, where the
    # kubelet's $(VAR) expansion cannot reach it (render.shell_word); a relative bind source
    # starts where `torchx run` runs, as --to docker reads one
    return render_appdef(build(data, source="torchx component"), extra_args=script_args,
                         max_retries=max_retries, named_resource=h, env_in_script=True,
                         workdir=os.getcwd())


def spec_mounts(words: List[str]) -> List[Dict[str, object]]:
    """TorchX's mount words (its CLI splits ``type=bind,src=/a,dst=/b`` at commas) -> job
    spec mounts, parsed by TorchX's own ``parse_mounts``."""
    out: List[Dict[str, object]] = []
    for mount in specs.parse_mounts(words):
        if isinstance(mount, specs.BindMount):
            out.append({"source": mount.src_path, "target": mount.dst_path,
                        "read_only": mount.read_only})
        elif isinstance(mount, specs.VolumeMount):
            out.append({"source": mount.src, "target": mount.dst_path,
                        "read_only": mount.read_only})
        else:
            raise ValueError(f"mount {mount}: only type=bind and type=volume are supported")
    return out

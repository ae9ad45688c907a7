"""The rendered example jobs in this folder, and the one command that regenerates them.

    python -m torchjob.k8s.manifests          # rewrite every *.yaml here from the renderer

Each variant is an example job spec from ``jobs/examples`` plus overrides; a test fails when
a file here drifts from what the renderer makes of its variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torchjob.jobs.examples
from torchjob.jobs.load import loads
from torchjob.jobs.spec import JobSpec
from torchjob.k8s.pod import manifests_text
from torchjob.k8s.pytorchjob import render_pytorchjob
from torchjob.k8s.store import render_store
from torchjob.k8s.trainjob import render_runtime, render_trainjob

HERE = Path(__file__).resolve().parent
# package data, also when installed
EXAMPLES = Path(torchjob.jobs.examples.__file__).resolve().parent
Renderer = Callable[[JobSpec], list[dict[str, Any]]]


def pytorchjob(spec: JobSpec) -> list[dict[str, Any]]:
    """The PyTorchJob and, for an elastic job, its rendezvous store's Deployment and Service."""
    return [render_pytorchjob(spec), *render_store(spec)]


def trainjob(spec: JobSpec) -> list[dict[str, Any]]:
    """The TrainJob, after its own TrainingRuntime when it needs one (Volcano, a priority)."""
    runtime = render_runtime(spec)
    return [*([runtime] if runtime is not None else []), render_trainjob(spec)]
GPU = ["nnodes=2", "nproc_per_node=4", "resources.gpus=4", "resources.cpu=16",
       "resources.memory=64Gi", "resources.shm=16Gi", "env.NCCL_DEBUG=WARN",
       'secrets=[{env: HF_TOKEN, secret: hf, key: token}]', "k8s.namespace=team-a",
       "k8s.queue=team-a-gpus", "k8s.priority_class=training", "k8s.pvc=team-a-runs"]
PVC = ["nnodes=2", "k8s.pvc=digits-runs", "k8s.ttl_seconds_after_finished=86400",
       "k8s.active_deadline_seconds=86400", "k8s.volcano_queue=research",
       "k8s.clean_pod_policy=All"]
# file name -> (example, overrides, renderer)
VARIANTS: dict[str, tuple[str, list[str], Renderer]] = {
    "pytorchjob-default.yaml": ("default", [], pytorchjob),
    "pytorchjob-elastic.yaml": ("elastic", [], pytorchjob),
    "pytorchjob-gpu.yaml": ("default", GPU, pytorchjob),
    "pytorchjob-pvc.yaml": ("default", PVC, pytorchjob),
    "trainjob.yaml": ("default", ["nnodes=2", "k8s.pvc=digits-runs"], trainjob),
    "trainjob-volcano.yaml": ("default", ["nnodes=2", "k8s.pvc=digits-runs",
                                          "k8s.volcano_queue=research",
                                          "k8s.priority_class=training"], trainjob),
    "trainjob-full.yaml": ("default", [*(o for o in GPU if not o.startswith(  # stock runtime
                                           ("k8s.priority_class=", "k8s.pvc="))),
                                       "k8s.pvc=digits-runs", "k8s.service_account="
                                       "trainer", "k8s.active_deadline_seconds=86400",
                                       "mounts=[{source: datasets, target: /data, "
                                       "read_only: true}]", "retry_on_error=true",
                                       "max_stalled_restarts=5", "hang_timeout=600",
                                       "collective_timeout=900"],
                           trainjob),
}


def variant_spec(name: str) -> JobSpec:
    example, overrides, _ = VARIANTS[name]
    path = EXAMPLES / f"{example}.yaml"
    return loads(path.read_text(), overrides, source=str(path))


def render_variant(name: str) -> str:
    """The text of one example manifest, with a header naming how it was made."""
    example, overrides, renderer = VARIANTS[name]
    head = f"# Rendered from jobs/examples/{example}.yaml"
    head += f" with {' '.join(overrides)}" if overrides else ""
    head += ".\n# Regenerate with: python -m torchjob.k8s.manifests (do not edit by hand)\n"
    return head + manifests_text(renderer(variant_spec(name)))


def regenerate_manifests(folder: Path = HERE) -> list[Path]:
    """Write every variant into ``folder``; returns the files written."""
    written = []
    for name in VARIANTS:
        path = folder / name
        path.write_text(render_variant(name))
        written.append(path)
    return written

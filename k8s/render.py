"""``torchjob render --to k8s[:trainjob]``: render, validate, then the text. Pure.

The one entry the command line needs: a rendered manifest that breaks a rule (a renderer bug,
or a spec whose ``env`` holds a literal secret) is refused, never printed or submitted. An
elastic PyTorchJob is three objects (the job, then its rendezvous store's Deployment and
Service, ``k8s.store``), printed as one multi-document YAML and submitted as they are.
"""

from __future__ import annotations

from typing import Any, Callable

from jobs.spec import JobSpec
from jobs.values import UserError
from k8s.yaml import manifests_text
from k8s.pytorchjob import render_pytorchjob
from k8s.store import render_store
from k8s.trainjob import render_trainjob
from k8s.validate import validate

TARGETS: dict[str, Callable[[JobSpec], dict[str, Any]]] = {
    "pytorchjob": render_pytorchjob,
    "trainjob": render_trainjob,
}


def render_objects(spec: JobSpec, target: str = "pytorchjob") -> list[dict[str, Any]]:
    """The validated objects of ``spec`` (``target``: pytorchjob or trainjob): the job first,
    then, for an elastic PyTorchJob, its rendezvous store's Deployment and Service."""
    if target not in TARGETS:
        raise UserError(f"unknown Kubernetes target {target!r}; valid: {', '.join(TARGETS)}")
    objs = [TARGETS[target](spec)]
    if target == "pytorchjob":
        objs += render_store(spec)
    for obj in objs:
        problems = validate(obj)
        if problems:
            raise UserError(f"the rendered {obj['kind']} breaks {len(problems)} rule(s): "
                            + "; ".join(str(p) for p in problems))
    return objs


def render_manifest(spec: JobSpec, target: str = "pytorchjob") -> str:
    """The validated manifest of ``spec`` as YAML, ready for ``kubectl apply -f -``."""
    return manifests_text(render_objects(spec, target))

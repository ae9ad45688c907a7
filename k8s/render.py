"""``torchjob render --to k8s[:trainjob]``: render, validate, then the text. Pure.

The one entry the command line needs: a rendered manifest that breaks a rule (a renderer bug,
or a spec whose ``env`` holds a literal secret) is refused, never printed or submitted.
"""

from __future__ import annotations

from typing import Any, Callable

from jobs.spec import JobSpec
from jobs.values import UserError
from k8s.pod import manifest_text
from k8s.pytorchjob import render_pytorchjob
from k8s.trainjob import render_trainjob
from k8s.validate import validate

TARGETS: dict[str, Callable[[JobSpec], dict[str, Any]]] = {
    "pytorchjob": render_pytorchjob,
    "trainjob": render_trainjob,
}


def render_object(spec: JobSpec, target: str = "pytorchjob") -> dict[str, Any]:
    """The validated object of ``spec`` (``target``: pytorchjob or trainjob)."""
    if target not in TARGETS:
        raise UserError(f"unknown Kubernetes target {target!r}; valid: {', '.join(TARGETS)}")
    obj = TARGETS[target](spec)
    problems = validate(obj)
    if problems:
        raise UserError(f"the rendered {obj['kind']} breaks {len(problems)} rule(s): "
                        + "; ".join(str(p) for p in problems))
    return obj


def render_manifest(spec: JobSpec, target: str = "pytorchjob") -> str:
    """The validated manifest of ``spec`` as YAML, ready for ``kubectl apply -f -``."""
    return manifest_text(render_object(spec, target))

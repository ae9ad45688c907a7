"""The Kubernetes backends: ``k8s`` (a Kubeflow PyTorchJob) and ``k8s:trainjob`` (a Kubeflow
Trainer v2 TrainJob). ``render`` is the validated objects (``render.py``); ``submit`` creates
exactly them, in order, through the kubeconfig's cluster (``client.py``); ``run`` follows the
pods' logs (``follow.py``). Handles: ``k8s:NAMESPACE/NAME``, ``k8s:trainjob:NAMESPACE/NAME``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from torchjob.jobs.backend import (BackendError, Backend, Context, Handle, JobStatus, Request,
                                   State)
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import DNS_1123_LABEL, DNS_1123_SUBDOMAIN
from torchjob.k8s.client import Cluster, JobRef, K8sError
from torchjob.k8s.follow import POLL_S
from torchjob.k8s.yaml import manifests_text, read_manifests
from torchjob.k8s.render import TARGETS, check, render_objects
from torchjob.k8s.validate import validate_text

KIND = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}
STATES = {"Created": State.PENDING, "Pending": State.PENDING, "Running": State.RUNNING,
          "Restarting": State.RUNNING, "Succeeded": State.SUCCEEDED, "Complete": State.SUCCEEDED,
          "Failed": State.FAILED, "Suspended": State.STOPPED}


class K8sBackend(Backend):
    def __init__(self, target: str) -> None:
        self.target = target
        self.name = "k8s" if target == "pytorchjob" else f"k8s:{target}"

    def render(self, spec: JobSpec, context: Context) -> Request:
        objs = render_objects(spec, self.target)
        return Request(self.name, spec.name, objs, manifests_text(objs), spec, context)

    def fits(self, spec: JobSpec) -> None:
        check(spec, self.target)

    def ready(self, request: Request) -> None:
        Cluster()  # a K8sError (exit 2) when no cluster is configured

    def submit(self, request: Request) -> Handle:
        """Creates the objects of ``request.text``, the manifest render and --dry-run print,
        read back (``torchjob.k8s.yaml`` quotes every string a YAML 1.1 reader could mistake)."""
        ref = Cluster().submit(read_manifests(request.text))
        return Handle(self.name, f"{ref.namespace}/{ref.name}")

    def parse_handle(self, text: str) -> Handle:
        target, colon, rest = text.partition(":")
        name, path = (f"k8s:{target}", rest) if colon else (self.name, text)
        if colon and target not in TARGETS:
            raise BackendError(f"unknown Kubernetes target {target!r}; valid: "
                               f"{', '.join(TARGETS)}")
        if name == "k8s:pytorchjob":
            name = "k8s"
        namespace, _, job = path.rpartition("/")
        if not DNS_1123_SUBDOMAIN.fullmatch(job) or (
                "/" in path and not DNS_1123_LABEL.fullmatch(namespace)):
            raise BackendError(f"{path!r} is not a job: write NAMESPACE/NAME or NAME, as "
                               "torchjob submit printed it")
        return Handle(name, path if "/" in path else f"default/{path}")

    def _ref(self, handle: Handle) -> JobRef:
        target = handle.backend.partition(":")[2] or "pytorchjob"
        return JobRef.parse(handle.id, KIND[target])

    def status(self, handle: Handle) -> JobStatus:
        state, conditions = Cluster().status(self._ref(handle))
        detail = "\n".join(f"{c.get('type')}={c.get('status')} {c.get('reason', '')} "
                           f"{c.get('message', '')}".rstrip() for c in conditions)
        return JobStatus(handle, STATES.get(state, State.UNKNOWN), name=handle.id.split("/")[-1],
                         detail=detail, raw={"condition": state, "conditions": conditions})

    def wait(self, handle: Handle) -> JobStatus:
        """Until the job ends; deleted while it ran (torchjob cancel) counts as cancelled."""
        try:
            while not (status := self.status(handle)).state.terminal:
                time.sleep(POLL_S)
        except K8sError as exc:
            if exc.http_status != 404:
                raise
            return JobStatus(handle, State.CANCELLED, name=handle.id.split("/")[-1],
                             detail="deleted")
        return status

    def logs(self, handle: Handle, *, follow: bool = False,
             log_dir: str | None = None) -> Iterator[str]:
        return Cluster().logs(self._ref(handle), follow=follow)

    def stamped_logs(self, handle: Handle) -> Iterator[tuple[float | None, str]]:
        return Cluster().stamped_logs(self._ref(handle))

    def cancel(self, handle: Handle) -> str:
        ref = self._ref(handle)
        gone = Cluster().cancel(ref)
        return f"deleted {', '.join(gone)}"

    def image_field(self, spec: JobSpec) -> str | None:
        return "image"  # the pods run the image, nothing of this machine

    def list(self) -> list[JobStatus]:
        kind = KIND[self.target]
        return [JobStatus(Handle(self.name, f"{ref.namespace}/{ref.name}"),
                          STATES.get(state, State.UNKNOWN), name=ref.name)
                for ref, state in Cluster().list(kind)]

    def validate(self, text: str, *, strict: bool = True) -> Sequence[str]:
        return [str(problem) for problem in validate_text(text, pod_security=strict,
                                                              runtime_pods=strict)]


def create(variant: str) -> K8sBackend:
    target = variant or "pytorchjob"
    if target not in TARGETS:
        raise BackendError(f"unknown Kubernetes target {variant!r}; valid: k8s (PyTorchJob), "
                           "k8s:trainjob")
    return K8sBackend(target)

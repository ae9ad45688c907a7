"""Submits, watches, reads and deletes jobs on a Kubernetes cluster (the only I/O in k8s/).

Pods are found by the operators' labels, their lines labelled as on every backend
(``follow.py``). The objects beside a job (an elastic PyTorchJob's store, a TrainJob's own
runtime) are owned by it and deleted with it. API errors become one-line ``K8sError``s that
say what to do (exit 2).
"""

from __future__ import annotations

import builtins
import os
from dataclasses import dataclass
from typing import Any, Iterator

import yaml

from torchjob.jobs.backend import missing_extra
from torchjob.jobs.values import UserError
from torchjob.k8s.follow import Run, follow_runs, labelled, node_rank, split_lines, unstamped
from torchjob.k8s.pod import MANAGED_BY, MANAGED_LABEL, NAME_LABEL
from torchjob.k8s.trainjob import OWN_RUNTIME_KIND, OWN_RUNTIME_SUFFIX

KINDS = {  # kind -> (group, version, plural, pod label naming the job, replica labels)
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs", "training.kubeflow.org/job-name",
                   ("training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index")),
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs",
                 "jobset.sigs.k8s.io/jobset-name", ("jobset.sigs.k8s.io/replicatedjob-name",
                                                    "batch.kubernetes.io/job-completion-index")),
}
# A job's own runtime (a TrainJob's, torchjob.k8s.trainjob), created before it and named after it.
RUNTIME_KINDS = {"TrainingRuntime": ("trainer.kubeflow.org", "v1alpha1", "trainingruntimes")}
# The objects beside a job (an elastic PyTorchJob's rendezvous store), by kind: the label that
# names their component, and the one that names their job.
STORE_KINDS = ("Service", "Deployment")
COMPONENT_LABEL, JOB_NAME_LABEL = "app.kubernetes.io/component", NAME_LABEL
STORE_COMPONENT, STORE_SUFFIX = "rendezvous", "-rdzv"
CONTAINER = {"PyTorchJob": "pytorch", "TrainJob": "node"}  # the container whose log is the job's
# The conditions after which no pod of the job runs (the backend's terminal states).
ENDED = ("Succeeded", "Complete", "Failed", "Suspended")
TIMEOUT_S = (30.0, 60.0)  # connect and read timeouts of a request; a log stream has no read one


class K8sError(UserError):
    """A cluster that cannot be reached or refuses the request: one line, exit 2."""

    def __init__(self, message: str, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status  # the API server's answer, None when there was none


@dataclass(frozen=True)
class JobRef:
    kind: str
    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str, kind: str = "PyTorchJob") -> "JobRef":
        """``NAME`` or ``NAMESPACE/NAME``."""
        namespace, _, name = text.rpartition("/")
        return cls(kind, namespace or "default", name)


def kubeconfig_named(kubeconfig: str | None) -> str | None:
    """The kubeconfig the client reads: the one given, those of ``KUBECONFIG`` that exist, or
    ~/.kube/config when it exists; None when there is none (as for kubectl, a missing file is
    no configuration: then the in-cluster account is the connection)."""
    if kubeconfig:
        return kubeconfig
    paths = os.environ.get("KUBECONFIG", "").split(os.pathsep)
    existing = [path for path in paths if path and os.path.exists(path)]
    if existing or paths != [""]:
        return os.pathsep.join(existing) or None
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def _unusable(named: str | None, exc: BaseException) -> K8sError:
    what = " ".join(str(exc).split())[:300] or type(exc).__name__
    return K8sError(f"the kubeconfig {named} cannot be used ({type(exc).__name__}: {what}); "
                    "fix it, or point KUBECONFIG at a working one")


class Cluster:
    """A connection from kubeconfig (``KUBECONFIG``, ~/.kube/config) or the in-cluster account."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        try:
            from kubernetes import client, config
        except ModuleNotFoundError as exc:
            raise missing_extra(exc, "k8s") from None
        named = kubeconfig_named(kubeconfig)
        try:
            config.load_kube_config(config_file=kubeconfig, context=context)
        except config.ConfigException as exc:
            if named is not None:  # a file the user named or has: its own problem, not "none"
                raise _unusable(named, exc) from None
            try:
                config.load_incluster_config()
            except config.ConfigException as exc:
                raise K8sError(f"no Kubernetes cluster configured ({exc}); set KUBECONFIG or "
                               "run inside a pod with a service account") from None
        except (yaml.YAMLError, OSError, ValueError, TypeError, LookupError,
                AttributeError) as exc:  # the client library reading a damaged file
            raise _unusable(named, exc) from None
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()
        self.apps = client.AppsV1Api()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError
        kwargs.setdefault("_request_timeout", TIMEOUT_S)
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise K8sError(_explain(what, exc.status, exc.reason, exc.body), exc.status) from None
        except (HTTPError, OSError) as exc:
            raise K8sError(f"{what}: the Kubernetes API server cannot be reached ({exc}); "
                           "check KUBECONFIG and the cluster") from None

    def submit(self, objs: list[dict[str, Any]]) -> JobRef:
        """The job's own runtime (a TrainJob's, first: the webhook refuses a job whose runtime does
        not exist yet), the job, then the objects beside it, as rendered but each owned by the
        job (an ``ownerReference`` to its uid), so that deleting the job by any means deletes
        them too. A job that cannot be created leaves nothing behind."""
        at = next(i for i, obj in enumerate(objs) if obj["kind"] in KINDS)
        before, job, rest = objs[:at], objs[at], objs[at + 1:]
        ref = JobRef(job["kind"], job["metadata"].get("namespace", "default"),
                     job["metadata"]["name"])
        for obj in before:
            group, version, plural = RUNTIME_KINDS[obj["kind"]]
            self._call(f"create {obj['kind']} {ref.namespace}/{obj['metadata']['name']}",
                       self.custom.create_namespaced_custom_object, group, version,
                       ref.namespace, plural, obj)
        group, version, plural, *_ = KINDS[ref.kind]
        try:
            made = self._call(f"create {ref.kind} {ref.namespace}/{ref.name}",
                              self.custom.create_namespaced_custom_object, group, version,
                              ref.namespace, plural, job)
        except K8sError:
            for obj in before:
                self._delete_runtime(ref.namespace, obj["kind"], obj["metadata"]["name"])
            raise
        uid = (made or {}).get("metadata", {}).get("uid") if isinstance(made, dict) else None
        owner = [{"apiVersion": job["apiVersion"], "kind": ref.kind, "name": ref.name,
                  "uid": uid}] if uid else []
        for obj in before if owner else []:
            group, version, plural = RUNTIME_KINDS[obj["kind"]]
            name = obj["metadata"]["name"]
            self._call(f"set the owner of {obj['kind']} {ref.namespace}/{name} (the job "
                       f"{ref.name} was created: torchjob cancel deletes it)",
                       self.custom.patch_namespaced_custom_object, group, version,
                       ref.namespace, plural, name, {"metadata": {"ownerReferences": owner}},
                       _content_type="application/merge-patch+json")
        for obj in rest:
            meta = {**obj["metadata"], **({"ownerReferences": owner} if owner else {})}
            create = {"Service": self.core.create_namespaced_service,
                      "Deployment": self.apps.create_namespaced_deployment}[obj["kind"]]
            self._call(f"create {obj['kind']} {ref.namespace}/{meta['name']} (the job "
                       f"{ref.name} was created: torchjob cancel deletes it)", create,
                       ref.namespace, {**obj, "metadata": meta})
        return ref

    def _delete_runtime(self, namespace: str, kind: str, name: str) -> bool:
        """Delete a job's own runtime; False when there is none."""
        group, version, plural = RUNTIME_KINDS[kind]
        try:
            self._call(f"delete {kind} {namespace}/{name}",
                       self.custom.delete_namespaced_custom_object, group, version, namespace,
                       plural, name)
        except K8sError as exc:
            if exc.http_status != 404:
                raise
            return False
        return True

    def get(self, ref: JobRef) -> dict[str, Any]:
        group, version, plural, *_ = KINDS[ref.kind]
        found: dict[str, Any] = self._call(
            f"read {ref.kind} {ref.namespace}/{ref.name}",
            self.custom.get_namespaced_custom_object, group, version, ref.namespace, plural,
            ref.name)
        return found

    def status(self, ref: JobRef) -> tuple[str, list[dict[str, Any]]]:
        """The newest true condition's type (Created, Running, Restarting, Succeeded, Failed,
        Suspended) and all conditions."""
        conditions = self.get(ref).get("status", {}).get("conditions", []) or []
        true = [c for c in conditions if str(c.get("status")) == "True"]
        return (true[-1]["type"] if true else "Pending"), conditions

    def ended(self, ref: JobRef) -> bool:
        """Whether no pod of the job runs any more: a terminal condition, or the job deleted."""
        try:
            return self.status(ref)[0] in ENDED
        except K8sError as exc:
            if exc.http_status == 404:
                return True
            raise

    def has_master(self, ref: JobRef) -> bool:
        """Whether the job's Workers count from node rank 1 (a PyTorchJob with a Master)."""
        job = self.get(ref)
        return ref.kind == "PyTorchJob" and "Master" in (
            job.get("spec", {}).get("pytorchReplicaSpecs") or {})

    def runs(self, ref: JobRef, has_master: bool) -> list[Run | None]:
        """The job's pods by node rank, each as the run of its container whose log can be
        read now, or None while that container is being created."""
        *_, job_label, (type_label, index_label) = KINDS[ref.kind]
        pods = self._call(f"list pods of {ref.namespace}/{ref.name}",
                          self.core.list_namespaced_pod, ref.namespace,
                          label_selector=f"{job_label}={ref.name}").items
        def node(pod: Any) -> int:
            labels = pod.metadata.labels or {}
            return node_rank(str(labels.get(type_label, "")), int(labels.get(index_label, 0)),
                             has_master)
        return [readable_run(pod, CONTAINER[ref.kind], node(pod))
                for pod in sorted(pods, key=node)]

    def logs(self, ref: JobRef, follow: bool = False) -> Iterator[str]:
        """Every line of every pod of the job, each labelled (``follow.labelled``); with
        ``follow``, as they are written, until the job has ended (``follow.py``)."""
        master = self.has_master(ref)  # a job that is not there is an error, not an empty log
        if not follow:
            return (line for _, line in self._read_all(ref, master))
        return follow_runs(lambda: (self.ended(ref),
                                    [run for run in self.runs(ref, master) if run]),
                           lambda run: self._stream(ref, run))

    def stamped_logs(self, ref: JobRef) -> Iterator[tuple[float | None, str]]:
        """Every line of every pod of the job, labelled, with when the kubelet says it was
        written (``timestamps=true``): what ages a progress line's ETA."""
        return self._read_all(ref, self.has_master(ref), timestamps=True)

    def _read_all(self, ref: JobRef, has_master: bool,
                  timestamps: bool = False) -> Iterator[tuple[float | None, str]]:
        runs = self.runs(ref, has_master)
        if not runs:
            raise K8sError(f"{ref.kind} {ref.namespace}/{ref.name} has no pods (yet): see "
                           "torchjob status")
        if not any(runs):
            raise K8sError(f"no pod of {ref.kind} {ref.namespace}/{ref.name} has started yet: "
                           "see torchjob status, or follow the logs with torchjob logs -f")
        for run in runs:
            if run is None:
                continue  # its container is being created: no log yet
            # raw bytes: kubernetes-client 36 turns a preloaded log into "b'...'"
            raw = self._call(f"read the log of {run.pod}", self.core.read_namespaced_pod_log,
                             run.pod, ref.namespace, container=CONTAINER[ref.kind],
                             timestamps=timestamps, _preload_content=False)
            for line in split_lines([raw.data]):
                when, text = unstamped(line) if timestamps else (None, line)
                yield when, labelled(run.node, text)

    def _stream(self, ref: JobRef, run: Run) -> Iterator[bytes] | None:
        """The run's log as it is written, ending with the run; None while it cannot be read
        (HTTP 400: the container is not started, a race with the listing)."""
        try:
            response = self._call(f"follow the log of {run.pod}",
                                  self.core.read_namespaced_pod_log, run.pod, ref.namespace,
                                  container=CONTAINER[ref.kind], follow=True,
                                  _preload_content=False, _request_timeout=(TIMEOUT_S[0], None))
        except K8sError as exc:
            if exc.http_status == 400:
                return None
            if exc.http_status == 404:  # the pod is gone
                return iter(())
            raise
        return _chunks(response, run.pod)

    def list(self, kind: str, namespace: str | None = None) -> list[tuple[JobRef, str]]:
        """Every job of ``kind`` (in ``namespace``, else the kubeconfig's, else all the account
        may see) with its newest true condition."""
        group, version, plural, *_ = KINDS[kind]
        found = self._call(f"list {plural}", self.custom.list_cluster_custom_object, group,
                           version, plural)
        out = []
        for obj in found.get("items", []):
            meta = obj.get("metadata", {})
            if namespace and meta.get("namespace") != namespace:
                continue
            conditions = obj.get("status", {}).get("conditions", []) or []
            true = [c for c in conditions if str(c.get("status")) == "True"]
            out.append((JobRef(kind, meta.get("namespace", "default"), meta.get("name", "")),
                        true[-1]["type"] if true else "Pending"))
        return out

    def cancel(self, ref: JobRef) -> "builtins.list[str]":
        """Delete the job, then what was made for it: a TrainJob's own TrainingRuntime, an
        elastic PyTorchJob's rendezvous store's Service and Deployment (each only when its
        labels say it is this job's). The names of what was deleted."""
        group, version, plural, *_ = KINDS[ref.kind]
        self._call(f"delete {ref.kind} {ref.namespace}/{ref.name}",
                   self.custom.delete_namespaced_custom_object, group, version, ref.namespace,
                   plural, ref.name)
        gone = [f"{ref.kind} {ref.namespace}/{ref.name}"]
        if ref.kind == "TrainJob":
            return gone + self._cancel_runtime(ref)
        if ref.kind != "PyTorchJob":
            return gone
        name = ref.name + STORE_SUFFIX
        for kind in STORE_KINDS:
            read, delete = {
                "Service": (self.core.read_namespaced_service,
                            self.core.delete_namespaced_service),
                "Deployment": (self.apps.read_namespaced_deployment,
                               self.apps.delete_namespaced_deployment)}[kind]
            what = f"{kind} {ref.namespace}/{name}"
            try:
                found = self._call(f"read {what}", read, name, ref.namespace)
                labels = found.metadata.labels or {}
                if (labels.get(COMPONENT_LABEL) == STORE_COMPONENT
                        and labels.get(JOB_NAME_LABEL) == ref.name):
                    self._call(f"delete {what}", delete, name, ref.namespace)
                    gone.append(what)
            except K8sError as exc:
                if exc.http_status != 404:  # a fixed-size job has none; or already gone
                    raise
        return gone

    def _cancel_runtime(self, ref: JobRef) -> "builtins.list[str]":
        """A TrainJob's own runtime, deleted when its labels say it is this job's (the
        ownerReference lets Kubernetes delete it too; an emulator or a slow GC may not)."""
        kind, name = OWN_RUNTIME_KIND, ref.name + OWN_RUNTIME_SUFFIX
        group, version, plural = RUNTIME_KINDS[kind]
        what = f"{kind} {ref.namespace}/{name}"
        try:
            found = self._call(f"read {what}", self.custom.get_namespaced_custom_object,
                               group, version, ref.namespace, plural, name)
        except K8sError as exc:
            # 404: the stock runtime's job has none, or it is gone; 403: an account that may
            # not read runtimes could not have made one
            if exc.http_status not in (403, 404):
                raise
            return []
        labels = (found.get("metadata") or {}).get("labels") or {}
        if labels.get(JOB_NAME_LABEL) != ref.name or labels.get(MANAGED_LABEL) != MANAGED_BY:
            return []
        return [what] if self._delete_runtime(ref.namespace, kind, name) else []


def readable_run(pod: Any, container: str, node: int) -> Run | None:
    """The run of ``container`` whose log the API serves now: running or terminated or, while
    it waits to be restarted, the one that ended (the kubelet serves that one). None while the
    container is being created (reading it then is HTTP 400)."""
    for status in (pod.status and pod.status.container_statuses) or []:
        if status.name != container:
            continue
        state, last = status.state, status.last_state
        if (state and (state.running or state.terminated)) or (last and last.terminated):
            meta = pod.metadata
            return Run(meta.name, meta.uid or meta.name, status.restart_count or 0, node)
    return None


def _chunks(response: Any, pod: str) -> Iterator[bytes]:
    """The body of a streamed response, chunk by chunk as the server sends them."""
    from urllib3.exceptions import HTTPError
    try:
        yield from response.stream(amt=None)
    except (HTTPError, OSError) as exc:
        raise K8sError(f"the log stream of {pod} broke off ({exc}); follow the job again "
                       "with torchjob logs -f") from None
    finally:
        response.release_conn()


def _explain(what: str, status: int | None, reason: str | None, body: Any) -> str:
    fixes = {
        409: "it already exists: delete it (torchjob cancel --to k8s NAMESPACE/NAME) or give "
             "the job another name (--set name=...)",
        403: "forbidden: your account may not do this; ask for RBAC rights on this resource",
        401: "not authenticated: refresh your kubeconfig credentials",
        404: "not found: check the name and namespace (NAMESPACE/NAME), and that the operator's "
             "CRD is installed",
        422: "the API server rejected the object as invalid; run torchjob validate on it",
    }
    return f"{what}: HTTP {status} {reason or ''}".rstrip() + f": {fixes.get(status or 0, body)}"

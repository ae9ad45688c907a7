"""Pod pieces shared by the PyTorchJob and TrainJob renderers: security context ("restricted"),
env (secrets only by ``secretKeyRef``), resources, ``/dev/shm`` and volumes. Pure."""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

from torchjob.jobs.command import kubelet_literal
from torchjob.jobs.spec import JobSpec
from torchjob.jobs.values import SpecError, bad, subdomain_problem
from torchjob.k8s.yaml import manifest_text as manifest_text  # re-exported: the one emitter
from torchjob.k8s.yaml import manifests_text as manifests_text
from torchjob.trainer.contract import thread_env

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
SHM_VOLUME = "dshm"
RUN_VOLUME = "run"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's topology-aware scheduling annotations on a pod template (kueue.sigs.k8s.io, "Run
# Workloads with Topology-Aware Scheduling"): k8s.topology's mode -> the annotation.
TOPOLOGY_ANNOTATION = {"required": "kueue.x-k8s.io/podset-required-topology",
                       "preferred": "kueue.x-k8s.io/podset-preferred-topology"}
# Every object torchjob renders: its job's name, and who made it (what cancel may delete).
NAME_LABEL, MANAGED_LABEL, MANAGED_BY = ("app.kubernetes.io/name",
                                         "app.kubernetes.io/managed-by", "torchjob")
# Waits until HOST:PORT accepts a connection (its name resolves and a store serves there: a
# Service publishes a pod only once it is ready), or, given HOST alone, until HOST resolves
# (a TrainJob's node 0, whose own agent will serve the store: it cannot wait for itself),
# then execs the rest of argv: no shell, values stay argv. A recreated store pod may take
# minutes (a new node, an image pull).
WAIT_FOR_HOST = (
    "import os, socket, sys, time\n"
    "host, _, port = sys.argv[1].partition(':')\n"
    "limit = time.monotonic() + float(sys.argv[2])\n"
    "while True:\n"
    "    try:\n"
    "        if port:\n"
    "            socket.create_connection((host, int(port)), timeout=5).close()\n"
    "        else:\n"
    "            socket.getaddrinfo(host, None)\n"
    "        break\n"
    "    except OSError as exc:\n"
    "        if time.monotonic() > limit:\n"
    "            sys.exit(f'{sys.argv[1]} did not answer in {sys.argv[2]} s: {exc}')\n"
    "        print(f'waiting for {sys.argv[1]}: {exc}', flush=True)\n"
    "        time.sleep(2)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def on_cluster(spec: JobSpec) -> JobSpec:
    """The spec as pods see it: a relative run_dir/checkpoint_dir placed on the PVC."""
    for i, mount in enumerate(spec.mounts):
        if mount.source.startswith("/"):
            raise bad(f"mounts[{i}].source", mount.source, "is a host path: Pod Security "
                      "'restricted' forbids hostPath volumes; name a PersistentVolumeClaim")
        if subdomain_problem(mount.source):
            raise bad(f"mounts[{i}].source", mount.source, "is not a PersistentVolumeClaim "
                      "name (lower case letters, digits, '-' and '.')")
    if not spec.k8s.pvc:
        return spec
    root = spec.k8s.pvc_mount_path
    for field in ("run_dir", "checkpoint_dir"):
        refuse_escape(spec, field, getattr(spec, field))
    return dataclasses.replace(spec, run_dir=posixpath.join(root, spec.run_dir),
                               checkpoint_dir=posixpath.join(root, spec.checkpoint_dir))


def under(path: str, root: str) -> bool:
    """Whether the absolute ``path``, once normalised, is ``root`` or lies below it."""
    root = posixpath.normpath(root)
    return posixpath.commonpath([root, posixpath.normpath(path)]) == root


def refuse_escape(spec: JobSpec, field: str, value: str) -> None:
    """A path meant for the PVC (relative, or written under k8s.pvc_mount_path) that ``..``
    leads out of it: refused, as docker refuses a ``../`` run_dir (torchjob.jobs.hosts)."""
    root = spec.k8s.pvc_mount_path
    meant = not value.startswith("/") or value.startswith(root.rstrip("/") + "/")
    where = posixpath.normpath(posixpath.join(root, value))
    if meant and not under(where, root):
        raise SpecError(field, f"{value!r} leaves k8s.pvc_mount_path ({root}), where k8s.pvc "
                        f"{spec.k8s.pvc!r} is mounted: it resolves to {where}, which the pods "
                        "do not share and lose when they end; write a path below it (relative, "
                        f"e.g. runs/{spec.name}, or absolute under {root})")


def checkpoint_claim(spec: JobSpec) -> str | None:
    """The PersistentVolumeClaim that holds ``checkpoint_dir`` (spec placed by ``on_cluster``):
    ``k8s.pvc``, or a writable ``mounts`` entry whose target holds it; None: in the pod."""
    mounted = [(spec.k8s.pvc_mount_path, spec.k8s.pvc)] if spec.k8s.pvc else []
    mounted += [(m.target, m.source) for m in spec.mounts if not m.read_only]
    where = posixpath.normpath(spec.checkpoint_dir)
    for target, claim in mounted:
        if where.startswith("/") and under(where, target):
            return claim
    return None


def shared_checkpoints(spec: JobSpec, pods: int) -> str | None:
    """Where a Kubernetes job's checkpoints live, the one rule for every renderer (spec placed by
    ``on_cluster``; ``pods``: the job's node pods at most): the name of the claim every pod
    mounts, or None when ``k8s.checkpoints: pod-local`` keeps them in each pod. A job of
    several pods, or an elastic one, without a claim is refused (docs/internals.md)."""
    claim = checkpoint_claim(spec)
    if spec.k8s.checkpoints == "pod-local":
        if claim is not None:
            raise bad("k8s.checkpoints", "pod-local", f"contradicts checkpoint_dir "
                      f"{spec.checkpoint_dir!r}, which is on the PersistentVolumeClaim "
                      f"{claim!r}: drop k8s.checkpoints (pvc is the default) or the claim")
        return None
    if claim is None and (pods > 1 or spec.nnodes.is_elastic):
        raise unshared(spec, pods)
    return claim


def unshared(spec: JobSpec, pods: int) -> SpecError:
    """The refusal of checkpoints no claim holds in a job of several (or elastic) pods."""
    why = (f"this job runs {pods} pods (nnodes {spec.nnodes}): each pod would keep its "
           "checkpoints to itself, so a resume misses the files another pod wrote "
           "(FileNotFoundError, or training silently starts over from step 0) and a recreated "
           "pod keeps nothing")
    root = spec.k8s.pvc_mount_path
    if spec.k8s.pvc:
        return SpecError("checkpoint_dir", f"{spec.checkpoint_dir!r} lies outside "
                         f"k8s.pvc_mount_path ({root}), where k8s.pvc {spec.k8s.pvc!r} is "
                         f"mounted, but {why}. Write a checkpoint_dir under {root} (or a "
                         "relative one, placed under it), put it on a writable mounts entry, "
                         "or set k8s.checkpoints: pod-local to run without resuming across pods")
    return SpecError("k8s.pvc", f"is not set, but {why}. Set k8s.pvc to a ReadWriteMany "
                     "PersistentVolumeClaim that every pod mounts (a relative checkpoint_dir "
                     "goes under k8s.pvc_mount_path), or set k8s.checkpoints: pod-local to run "
                     "without resuming across pods")


def labels(spec: JobSpec) -> Obj:
    out: Obj = {NAME_LABEL: spec.name, MANAGED_LABEL: MANAGED_BY}
    if spec.k8s.queue:
        out[QUEUE_LABEL] = spec.k8s.queue
    return out


def metadata(spec: JobSpec) -> Obj:
    return {"name": spec.name, "namespace": spec.k8s.namespace, "labels": labels(spec)}


def container_security(spec: JobSpec) -> Obj:
    """Pod Security "restricted", stated on every container (init containers too)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True, "runAsUser": spec.k8s.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"}}


def pod_security(spec: JobSpec) -> Obj:
    out: Obj = {"runAsNonRoot": True, "runAsUser": spec.k8s.run_as_user,
                "runAsGroup": spec.k8s.run_as_user, "seccompProfile": {"type": "RuntimeDefault"}}
    if spec.k8s.fs_group is not None:
        out["fsGroup"] = spec.k8s.fs_group
    return out


def env_values(values: dict[str, str]) -> list[Obj]:
    """Plain ``{name, value}`` entries, each value as the kubelet must receive it
    (``kubelet_literal``: its ``$(VAR)`` expansion gives back the value itself)."""
    return [{"name": name, "value": kubelet_literal(value)} for name, value in values.items()]


def command_words(words: list[str]) -> list[str]:
    """A container's command, each word as the kubelet must receive it (``kubelet_literal``)."""
    return [kubelet_literal(word) for word in words]


def env(spec: JobSpec) -> list[Obj]:
    """The workers' thread count, as every backend sets it (the pod's CPU request shared by
    its workers, one when unset; a value in ``env`` wins), plain values from ``env``; secrets
    only as ``valueFrom.secretKeyRef``."""
    plain = {**thread_env(spec.resources.cpu, spec.procs),
             **spec.env}
    out: list[Obj] = env_values(plain)
    out += [{"name": ref.env, "valueFrom": {"secretKeyRef": {"name": ref.secret,
                                                             "key": ref.key}}}
            for ref in spec.secrets]
    return out


def resources(spec: JobSpec) -> Obj:
    """Requests for CPU and memory; memory and GPUs also as limits (no CPU limit: throttling)."""
    res = spec.resources
    requests: Obj = {}
    limits: Obj = {}
    if res.cpu is not None:
        milli = round(res.cpu * 1000)
        requests["cpu"] = str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
    if res.memory is not None:
        requests["memory"] = limits["memory"] = res.memory.text
    if res.gpus:
        requests[GPU] = limits[GPU] = str(res.gpus)
    out: Obj = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def volumes(spec: JobSpec) -> tuple[list[Obj], list[Obj]]:
    """(pod volumes, container mounts): /dev/shm in memory, the run PVC, further PVCs."""
    vols: list[Obj] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory",
                                                         "sizeLimit": spec.resources.shm.text}}]
    mounts: list[Obj] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if spec.k8s.pvc:
        vols.append({"name": RUN_VOLUME, "persistentVolumeClaim": {"claimName": spec.k8s.pvc}})
        mounts.append({"name": RUN_VOLUME, "mountPath": spec.k8s.pvc_mount_path})
    for i, mount in enumerate(spec.mounts):
        name = f"mount-{i}"
        vols.append({"name": name, "persistentVolumeClaim": {"claimName": mount.source,
                                                             "readOnly": mount.read_only}})
        mounts.append({"name": name, "mountPath": mount.target, "readOnly": mount.read_only})
    targets = [m["mountPath"] for m in mounts]
    if len(set(targets)) != len(targets):
        raise SpecError("mounts", f"two volumes are mounted at the same path ({targets}); "
                        "move k8s.pvc_mount_path or the mount target")
    return vols, mounts


def pod_spec(spec: JobSpec, container: Obj) -> Obj:
    """The pod around one container: security, volumes, service account, priority, the stop
    grace (``stop_grace``: above the workers' checkpoint budget, torchjob.jobs.timeouts)."""
    vols, mounts = volumes(spec)
    container = {**container, "env": env(spec), "resources": resources(spec),
                 "volumeMounts": mounts, "securityContext": container_security(spec)}
    for key in ("env", "resources"):
        if not container[key]:
            del container[key]
    pod: Obj = {"securityContext": pod_security(spec)}
    if spec.k8s.service_account:
        pod["serviceAccountName"] = spec.k8s.service_account
    else:  # the trainer needs no API access: no token in the pod
        pod["automountServiceAccountToken"] = False
    if spec.k8s.priority_class:
        pod["priorityClassName"] = spec.k8s.priority_class
    # a deleted or preempted pod's time to checkpoint (Kubernetes' default is 30 s)
    pod["terminationGracePeriodSeconds"] = spec.stop_grace
    pod["containers"] = [container]
    pod["volumes"] = vols
    return pod

"""What a PyTorchJob's pods do, for real, in podman: an emulator of the operator's pod handling
(the operator and an API server cannot run here; shared/K8S-CONTRACT.md says what they do).

Each replica's pod is a container on one podman network per job, reachable by the pod's name
(its host name, as the pod's headless Service makes it), with the pod's
image, command, env, user and volumes plus exactly the env the operator injects. A
PersistentVolumeClaim is a host directory (``claims``: name -> directory), mounted where the
pod mounts it, its group set to the pod's ``fsGroup`` as the kubelet does (read-only claims
are left alone). The Master's pod starts first: the operator's init container makes Workers
wait until it resolves (that container is not run, its image is not here; but the pods are
checked as the operator mutates them, ``as_mutated``: a namespace enforcing Pod Security
"restricted", the default here, refuses pods that break it, ``forbidden``, and nothing
starts). The job's fate follows the operator's rules: ``restartPolicy``
(ExitCode: a pod whose container ended with 128 or more is created again, 1-127 fail the job
for good; OnFailure: any failure; Never: none), ``runPolicy.backoffLimit`` (pods created
again in all), success (the Master's, else every Worker's, or for an elastic job any
Worker's), ``cleanPodPolicy`` Running (a finished job's running pods are deleted: SIGTERM,
then SIGKILL after the grace period). Deleting the job (``PodJob.delete``) deletes its pods.

The objects submitted beside the job (an elastic job's rendezvous store, ``torchjob.k8s.store``) run
too: each Deployment's pod is a container (created again whenever it ends, as the Deployment
controller would), reachable by the name of every Service whose selector matches its labels
(the Service's ClusterIP stands for the pod; ports must equal targetPorts).

Names are not served by podman's DNS (aardvark-dns 1.4 sometimes answers a container started
right after another "Name or service not known" for good: a worker pod then never found the
store). Each pod keeps one address on the job's network for all its incarnations, as a
Service's ClusterIP stays when its pod is recreated, and every container's /etc/hosts names
them all. A pod that is gone: its address answers "No route to host" (a ClusterIP with no
endpoints: "Connection refused"); both are what a client retries.
They are owned by the job, so they go when it ends (here: when it is over, as if the job were
deleted then). ``PodJob.lose`` takes a pod away for good (its node gone: killed, never created
again), as a node loss the operator cannot reschedule would.

``tests/k8s/pods_run.py`` is ``torchjob run --to k8s`` against it.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchjob.jobs.backend import ClosingLines
from torchjob.jobs.values import UserError
from torchjob.k8s.follow import Run, follow_runs, node_rank
from tests.k8s.pods_operator import forbidden, injected
from torchjob.trainer.contract import EXIT_OK, EXIT_STOPPED

GRACE_S = 30.0  # terminationGracePeriodSeconds' default
JOB_LABEL = "io.torchjob.pods.job"  # every container of one emulated job
POD_LABEL = "io.torchjob.pods.pod"  # the pod a container is (an incarnation of)
ANNOUNCE = "torchjob-pods: job"  # the runner's first line: ANNOUNCE TOKEN NAME
ANNOUNCE_RE = re.compile(rf"^{re.escape(ANNOUNCE)} (\S+) ", re.M)
# one look of the control loop a second (one podman inspect: ~0.1 s of CPU, in a CPU-bound suite)
POLL_S = 1.0
QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
            "G": 10**9, "": 1}
Obj = dict[str, Any]


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False, start_new_session=True)


def quantity(text: str) -> int:
    """A Kubernetes quantity (``1Gi``, ``512Mi``) in bytes."""
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text).groups()  # type: ignore[union-attr]
    return int(float(number) * QUANTITY[unit])


def share(folder: Path, group: int) -> None:
    """The kubelet's fsGroup on a volume: the tree's group is ``group``, group-writable,
    directories setgid so that new files keep the group."""
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        os.chown(path, -1, group)
        mode = path.stat().st_mode
        path.chmod(mode | 0o060 | (0o2010 if path.is_dir() else 0))


@dataclass
class Pod:
    """One pod of the job and the container that is it now (a new one when recreated)."""

    name: str  # <job>-master-0, <job>-worker-1
    replica: str  # Master | Worker
    index: int
    argv: list[str]  # podman run ... without --name
    container: str = ""
    incarnation: int = -1
    status: str = "created"
    code: int | None = None  # the exit code of the container that is the pod now
    lost: bool = False  # taken away for good (PodJob.lose): never created again

    @property
    def label(self) -> str:
        return f"{self.replica.lower()}-{self.index}"

    @property
    def ended(self) -> bool:
        return self.code is not None


@dataclass
class PodJob:
    """A PyTorchJob's pods in podman, as the operator would run them; ``beside``: the objects
    submitted with it (Deployments and Services)."""

    job: Obj
    claims: dict[str, Path]
    grace: float = GRACE_S
    beside: list[Obj] = field(default_factory=list)
    restricted: bool = True  # the namespace enforces Pod Security "restricted"
    stores: list[Pod] = field(default_factory=list)  # the Deployments' pods
    token: str = field(default_factory=lambda: f"tjpods-{secrets.token_hex(4)}")
    pods: list[Pod] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)  # every incarnation, for logs and rm
    recreated: int = 0
    deleted: bool = False
    outcome: int | None = None  # the job's exit code once it has ended
    why: str = ""
    stopper: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    subnet: str = ""  # the network's /24 prefix, "10.X.Y"
    hosts: dict[str, str] = field(default_factory=dict)  # every pod's and Service's address

    @property
    def network(self) -> str:
        return self.token

    def make_network(self) -> None:
        """The job's network: a free /24 of 10.0.0.0/8, no DNS (``hosts`` names pods)."""
        made = None
        for _ in range(20):
            self.subnet = f"10.{secrets.randbelow(200) + 50}.{secrets.randbelow(256)}"
            made = podman("network", "create", "--disable-dns", "--subnet",
                          f"{self.subnet}.0/24", "--label", f"{JOB_LABEL}={self.token}",
                          self.network)
            if made.returncode == 0:
                return
        raise RuntimeError(f"podman network create: no free subnet: {made and made.stderr}")

    def address(self, *names: str) -> str:
        """The address of the pod named ``names[0]`` (also reachable as the others)."""
        ip = f"{self.subnet}.{len(set(self.hosts.values())) + 10}"
        for name in names:
            self.hosts[name] = ip
        return ip

    def start(self) -> None:
        """The network, then each replica's pod (the Master's first). With ``restricted``
        (a namespace enforcing Pod Security "restricted"), pods that break it, as the
        operator mutates them, are refused as the API server would: nothing starts."""
        if self.restricted and (problems := forbidden([self.job, *self.beside])):
            raise UserError(f"{self.name}: pods forbidden: violates PodSecurity "
                            f"\"restricted:latest\": {'; '.join(problems)}")
        self.make_network()
        for obj in self.beside:
            if obj["kind"] == "Deployment":
                self.stores.append(self.deployment_pod(obj))
        specs = self.job["spec"]["pytorchReplicaSpecs"]
        for replica in sorted(specs, key=lambda r: r != "Master"):
            for index in range(specs[replica]["replicas"]):
                name = f"{self.name}-{replica.lower()}-{index}"
                self.pods.append(Pod(name, replica, index, self.pod_argv(replica, index, name)))
        for store in self.stores:  # every address is known: each /etc/hosts names them all
            self.create(store)
        for pod in self.pods:
            if self.deleted:  # deleted while its pods were being created
                break
            self.create(pod)

    def deployment_pod(self, deployment: Obj) -> Pod:
        """The pod of a Deployment of one replica, named by the Services that select it."""
        template = deployment["spec"]["template"]
        labels = template["metadata"]["labels"]
        aliases = []
        for service in self.beside:
            if service["kind"] != "Service":
                continue
            if all(labels.get(k) == v for k, v in service["spec"]["selector"].items()):
                for port in service["spec"]["ports"]:
                    if port.get("targetPort", port["port"]) != port["port"]:
                        raise UserError(f"Service {service['metadata']['name']}: a port other "
                                        "than its targetPort is not emulated here")
                aliases.append(service["metadata"]["name"])
        name = f"{deployment['metadata']['name']}-{secrets.token_hex(3)}"
        (container,) = template["spec"]["containers"]
        argv = self.container_argv(template["spec"], container, name, aliases, {})
        return Pod(name, "Deployment", 0, argv)

    def pod_argv(self, replica: str, index: int, name: str) -> list[str]:
        rspec = self.job["spec"]["pytorchReplicaSpecs"][replica]
        spec = rspec["template"]["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == "pytorch"]
        return self.container_argv(spec, container, name, [name],
                                   injected(self.job, replica, index))

    def container_argv(self, spec: Obj, container: Obj, name: str, aliases: list[str],
                       operator_env: dict[str, str]) -> list[str]:
        """``podman run`` arguments of one pod: host name, aliases, user, volumes, env."""
        security = spec.get("securityContext", {})
        user = container.get("securityContext", {}).get("runAsUser", security.get("runAsUser"))
        group = security.get("runAsGroup", user)
        argv = ["--hostname", name, "--network", self.network, "--ip",
                self.address(name, *aliases),
                "--label", f"{JOB_LABEL}={self.token}", "--label", f"{POD_LABEL}={name}"]
        if user is not None:
            argv += ["--user", f"{user}:{group}" if group is not None else str(user)]
        if "fsGroup" in security:
            argv += ["--group-add", str(security["fsGroup"])]
        csec = container.get("securityContext", {})
        if "ALL" in csec.get("capabilities", {}).get("drop", []):
            argv += ["--cap-drop", "ALL"]
        if csec.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory" \
                    and mount["mountPath"] == "/dev/shm":
                size = volume["emptyDir"].get("sizeLimit", "64Mi")
                argv += ["--shm-size", str(quantity(size))]
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if claim not in self.claims:
                    raise UserError(f"pod {name} mounts the PersistentVolumeClaim {claim!r}: "
                                    f"give it a directory (--claim {claim}=DIR)")
                read_only = mount.get("readOnly") or volume["persistentVolumeClaim"].get(
                    "readOnly")
                if not read_only and "fsGroup" in security:
                    share(self.claims[claim], int(security["fsGroup"]))
                argv += ["-v", f"{self.claims[claim]}:{mount['mountPath']}"
                         + (":ro" if read_only else "")]
            else:
                raise UserError(f"pod {name}: volume {mount['name']} is not emulated here")
        env: dict[str, str] = {}
        for item in container.get("env", []):
            if "value" not in item:
                raise UserError(f"pod {name}: env {item['name']} comes from a Secret, which "
                                "is not emulated here")
            env[item["name"]] = item["value"]
        env.update(operator_env)
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        if "workingDir" in container:
            argv += ["--workdir", container["workingDir"]]
        return [*argv, container["image"], *container.get("command", []),
                *container.get("args", [])]

    def create(self, pod: Pod) -> None:
        """The pod (again): a new container with the pod's name as its host name."""
        pod.incarnation += 1
        pod.container = f"{self.token}-{pod.name}-{pod.incarnation}"
        hosts = [a for host, ip in self.hosts.items() for a in ("--add-host", f"{host}:{ip}")]
        limit = time.monotonic() + 30
        while True:
            made = podman("run", "-d", "--name", pod.container, *hosts, *pod.argv)
            # the pod's last container may still be releasing its address (conmon's cleanup)
            if made.returncode == 0 or "already allocated" not in made.stderr \
                    or time.monotonic() > limit:
                break
            podman("rm", "-f", pod.container)
            time.sleep(POLL_S)
        if made.returncode != 0:
            raise RuntimeError(f"podman run {pod.name}: {made.stderr}")
        self.containers.append(pod.container)
        pod.status, pod.code = "running", None

    def refresh(self) -> None:
        """Each pod's container's status and exit code (one inspect call)."""
        pods = [pod for pod in [*self.pods, *self.stores] if pod.container]
        if not pods:
            return
        seen = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                      *[pod.container for pod in pods])
        for pod, line in zip(pods, seen.stdout.splitlines()):
            status, code = line.split()
            pod.status = status
            pod.code = int(code) if status in ("exited", "stopped", "dead") else None

    def restarts(self, pod: Pod, code: int) -> bool:
        """Whether the pod's replica's restartPolicy creates it again after ``code``."""
        policy = self.job["spec"]["pytorchReplicaSpecs"][pod.replica]["restartPolicy"]
        return {"ExitCode": code >= 128, "OnFailure": code != 0, "Always": True,
                "Never": False}[policy]

    def step(self) -> bool:
        """One look at the pods, as the operator's control loop: pods recreated, the job
        judged. True once the job has ended (its pods may still be stopping)."""
        self.refresh()
        if self.outcome is None and not self.deleted:
            for store in self.stores:  # the Deployment controller
                if store.ended:
                    print(f"{ANNOUNCE} {self.token}: {store.name} exited {store.code}: created "
                          "again (Deployment)", file=sys.stderr, flush=True)
                    self.create(store)
            self.judge()
        over = self.outcome is not None or self.deleted
        return over and all(pod.ended or not pod.container for pod in [*self.pods, *self.stores])

    def judge(self) -> None:
        specs = self.job["spec"]["pytorchReplicaSpecs"]
        elastic = "elasticPolicy" in self.job["spec"]
        backoff = self.job["spec"].get("runPolicy", {}).get("backoffLimit")
        if "Master" in specs:
            done = any(p.replica == "Master" and p.code == 0 for p in self.pods)
        elif elastic:
            done = any(p.code == 0 for p in self.pods)
        else:
            done = all(p.code == 0 for p in self.pods)
        if done:
            return self.finish(EXIT_OK, "Succeeded")
        for pod in self.pods:
            if pod.code in (None, 0) or pod.lost:
                continue
            if not self.restarts(pod, pod.code):
                return self.finish(pod.code, f"Failed: {pod.name} exited {pod.code}")
            if backoff is not None and self.recreated >= backoff:
                return self.finish(pod.code, f"Failed: backoffLimit {backoff} reached "
                                             f"({pod.name} exited {pod.code})")
            self.recreated += 1
            print(f"{ANNOUNCE} {self.token}: {pod.name} exited {pod.code}: created again "
                  f"({self.recreated} in all)", file=sys.stderr, flush=True)
            self.create(pod)

    def finish(self, code: int, why: str) -> None:
        """The job ended: cleanPodPolicy Running deletes its running pods."""
        self.outcome, self.why = code, why
        self.stop_running()

    def delete(self) -> None:
        """The job deleted (kubectl delete, torchjob cancel): every pod gets SIGTERM, then
        SIGKILL after the grace period."""
        if not self.deleted and self.outcome is None:
            self.deleted = True
            self.stop_running()

    def lose(self, pod: Pod) -> None:
        """``pod`` gone for good, as with its node: SIGKILL, never created again."""
        pod.lost = True
        self.kill(pod)

    def kill(self, pod: Pod) -> None:
        """``pod`` killed (SIGKILL, exit 137), as when its node dies; its controller decides
        what follows (a Deployment's pod is created again, a job's per its restartPolicy)."""
        killed = podman("kill", pod.container)
        if killed.returncode != 0:
            raise RuntimeError(f"podman kill {pod.container}: {killed.stderr}")

    def stop_running(self) -> None:
        """The job's running pods, and the objects it owns (its store), stopped."""
        running = [pod.container for pod in [*self.pods, *self.stores]
                   if pod.container and not pod.ended]
        if running and self.stopper is None:
            self.stopper = subprocess.Popen(
                ["podman", "stop", "-t", str(int(self.grace)), *running],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def result(self) -> int:
        """The job's exit code: its outcome, or for a deleted job 143 when every pod that
        was stopped checkpointed (exited 143 or 0), else the first other code."""
        if self.outcome is not None:
            return self.outcome
        codes = [pod.code for pod in self.pods if pod.code not in (None, 0, EXIT_STOPPED)]
        return int(codes[0]) if codes else EXIT_STOPPED

    def runs(self) -> list[Run]:
        master = "Master" in self.job["spec"]["pytorchReplicaSpecs"]
        return [Run(pod.name, pod.container, 0, node_rank(pod.replica, pod.index, master))
                for pod in self.pods if pod.container]

    def logs(self, run: Run) -> Iterator[bytes]:
        proc = subprocess.Popen(["podman", "logs", "-f", run.uid], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        try:
            yield from iter(lambda: os.read(fd, 65536), b"")
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()

    def follow(self) -> Iterator[str]:
        """Every pod's lines, labelled as ``torchjob logs`` does, until the job has ended (each
        step of the control loop is a look of ``k8s.follow``, the real backend's follower)."""
        def look() -> tuple[bool, list[Run]]:
            ended = self.step()
            return ended, self.runs()
        return follow_runs(look, self.logs, poll_s=POLL_S)

    def remove(self) -> None:
        """Nothing of the job left: its containers and network."""
        if self.stopper is not None:
            self.stopper.kill()
            self.stopper.wait()
        if self.containers:
            podman("rm", "-f", "-t", "0", *self.containers, timeout=300)
        podman("network", "rm", "-f", self.network)

    def logs_of(self, pod: Pod) -> str:
        proc = podman("logs", pod.container)
        return proc.stdout + proc.stderr


def leftovers(token: str) -> list[str]:
    """Containers and networks of the emulated job ``token`` still there."""
    found = podman("ps", "-a", "-q", "--filter", f"label={JOB_LABEL}={token}").stdout.split()
    found += podman("network", "ls", "-q", "--filter",
                    f"label={JOB_LABEL}={token}").stdout.split()
    return found


def run(manifest: Obj | list[Obj], claims: dict[str, Path], *, grace: float = GRACE_S,
        out: Any = None, during: Callable[[PodJob], None] | None = None) -> tuple[int, PodJob]:
    """The job's pods to the end (lines to ``out``, when given); (exit code, the job).
    ``manifest``: the PyTorchJob, or the objects ``torchjob submit`` sends (the job first).
    ``during``: called in a thread of its own once the pods started (a test's chaos). SIGINT
    and SIGTERM delete the job."""
    job, *beside = manifest if isinstance(manifest, list) else [manifest]
    pods = PodJob(job, claims, grace, beside)
    chaos: threading.Thread | None = None
    before = {s: signal.signal(s, lambda *_: pods.delete())
              for s in (signal.SIGINT, signal.SIGTERM)}
    closings = ClosingLines()
    try:
        print(f"{ANNOUNCE} {pods.token} {pods.name}: the PyTorchJob's pods in podman "
              "(an emulator of the operator)", file=sys.stderr, flush=True)
        pods.start()
        if during is not None:
            chaos = threading.Thread(target=during, args=(pods,), daemon=True)
            chaos.start()
        for line in pods.follow():
            closings.see(line)
            if out is not None:
                print(line, file=out, flush=True)
        code = pods.result()
        if code not in (EXIT_OK, EXIT_STOPPED) and (said := closings.code()) is not None:
            # as torchjob run --to k8s judges a failed job (Backend.exit_code): the first-hand
            # line's code, not that of the pod the operator saw fail first (one that only
            # heard of the failure, exit 1)
            code = said
        print(f"{ANNOUNCE} {pods.token}: {pods.why or 'deleted'}; exit code {code}",
              file=sys.stderr, flush=True)
        if code not in (EXIT_OK, EXIT_STOPPED):
            closings.report("the pods' logs above", sys.stderr)
        return code, pods
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if chaos is not None:
            chaos.join(timeout=60)
        pods.remove()

"""A Kubernetes API EMULATOR for the client tests: no API server can run on these machines.

It speaks real HTTP/1.1 with the paths and JSON shapes of the API the client uses (namespaced
custom objects, Deployments and Services: create with a uid, read, delete; pods by label
selector, with a status as the kubelet reports it; pod logs (``?timestamps=true``: each line
stamped with when it was written), and with ``?follow=true`` a log streamed in chunked
transfer encoding until its container run ends, as the real server does), keeps objects in memory, and can be told to answer 403 to
everything. It is not Kubernetes: no admission, no controllers, no kubelet. Tests play those:
they add pods (``add_pod``), write their logs (``append_log``), start, restart and remove them,
end jobs (``finish``), and wait for what the client did (``wait``).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
SERVICES = re.compile(r"^/api/(v1)/namespaces/([^/]+)/(services)(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
CLUSTER_LIST = re.compile(r"^/apis/([^/]+)/([^/]+)/([^/]+)$")
LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
JOB_LABELS = ("training.kubeflow.org/job-name", "jobset.sigs.k8s.io/jobset-name")


def _flag(query: dict[str, list[str]], name: str) -> bool:
    """A boolean query parameter, read as the API server reads it (Go's strconv.ParseBool):
    the Python client sends ``follow=True``."""
    return query.get(name, [""])[0] in ("1", "t", "T", "true", "TRUE", "True")


def _merge_patch(obj: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    out = dict(obj) if isinstance(obj, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Emulator:
    """``operator=True`` also plays a very small operator: each created job is Running at
    once, with one pod per replica whose log is one line (what a README session shows)."""

    def __init__(self, operator: bool = False) -> None:
        self.operator = operator
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self.pods: dict[str, list[dict[str, Any]]] = {}  # namespace -> pods
        self.runs: dict[str, list[str]] = {}  # pod uid -> the log of each run of its container
        # pod uid -> each run's writes: (where the log ended after it, when), for timestamps=true
        self.writes: dict[str, list[list[tuple[int, float]]]] = {}
        self.clock = time.time  # when a write happens: a test may set it to one in the past
        self.log_reads: list[tuple[str, bool, int]] = []  # (pod, follow, HTTP status)
        self.pod_lists = 0  # how often pods were listed
        self.chunk_size = 1 << 16  # a followed log is sent in chunks of at most this many bytes
        self.forbidden = False
        self.changed = threading.Condition()  # every request and every change notifies it
        self.closed = False
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the API server

            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, code: int, body: Any, text: bool = False) -> None:
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def status(self, code: int, reason: str, message: str = "") -> None:
                self.reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": reason, "code": code, "message": message or reason})

            def handle_any(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""  # read, or keep-alive breaks
                with emulator.changed:
                    answer = emulator.answer(self, method, body)
                    emulator.changed.notify_all()
                if answer is not None:
                    emulator.stream_log(self, *answer)

            def do_GET(self) -> None:
                self.handle_any("GET")

            def do_POST(self) -> None:
                self.handle_any("POST")

            def do_DELETE(self) -> None:
                self.handle_any("DELETE")

            def do_PATCH(self) -> None:
                self.handle_any("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Emulator":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Any) -> str:
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
            f"clusters: [{{name: emu, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: emu, user: {token: emulator}}]\n"
            "contexts: [{name: emu, context: {cluster: emu, user: emu}}]\n")
        return str(path)

    # -- the API (called with self.changed held) --

    def answer(self, http: Any, method: str, body: bytes) -> tuple[str, int] | None:
        """Reply to one request; a followed log is returned as (pod uid, run) to stream."""
        if self.forbidden:
            return http.status(403, "Forbidden")
        url = urlparse(http.path)
        query = parse_qs(url.query)
        if m := (CUSTOM.match(url.path) or SERVICES.match(url.path)):
            ns, plural, name = m.groups()[-3:]
            if method == "POST" and name is None:
                obj = json.loads(body)
                obj["metadata"]["uid"] = str(uuid.uuid4())  # as the API server sets it
                key = (plural, ns, obj["metadata"]["name"])
                if key in self.objects:
                    return http.status(409, "AlreadyExists")
                self.objects[key] = obj
                if self.operator and obj.get("kind") in ("PyTorchJob", "TrainJob"):
                    self.operate(ns, obj)
                return http.reply(201, obj)
            key = (plural, ns, name or "")
            if key not in self.objects:
                return http.status(404, "NotFound")
            if method == "DELETE":
                self.objects.pop(key)
                return http.reply(200, {"kind": "Status", "status": "Success"})
            if method == "PATCH":
                if http.headers.get("Content-Type") != "application/merge-patch+json":
                    return http.status(415, "UnsupportedMediaType")
                self.objects[key] = _merge_patch(self.objects[key], json.loads(body))
                return http.reply(200, self.objects[key])
            return http.reply(200, self.objects[key])
        if (m := CLUSTER_LIST.match(url.path)) and method == "GET":
            items = [obj for (plural, _, _), obj in sorted(self.objects.items())
                     if plural == m.group(3)]
            return http.reply(200, {"kind": "List", "items": items})
        if m := PODS.match(url.path):
            selector = query.get("labelSelector", [""])[0]
            want = dict(part.split("=", 1) for part in selector.split(",") if part)
            items = [p for p in self.pods.get(m.group(1), [])
                     if all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]
            self.pod_lists += 1
            return http.reply(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                    "items": items})
        if m := LOG.match(url.path):
            ns, name = m.groups()
            follow = _flag(query, "follow")
            code, found = self.readable(ns, name, query.get("container", [""])[0],
                                        _flag(query, "previous"))
            self.log_reads.append((name, follow, code))
            if code != 200:
                return http.status(code, "NotFound" if code == 404 else "BadRequest", found)
            uid, run = found.split("/")
            if not follow:
                text = self.runs[uid][int(run)]
                if _flag(query, "timestamps"):
                    text = self.stamped(text, self.writes[uid][int(run)])
                return http.reply(200, text, text=True)
            return uid, int(run)
        return http.status(404, "NotFound")

    def readable(self, ns: str, name: str, container: str, previous: bool) -> tuple[int, str]:
        """(200, "UID/RUN" whose log is served) or (the kubelet's HTTP error, its message)."""
        pod = self.pod(ns, name)
        if pod is None:
            return 404, f'pods "{name}" not found'
        status = pod["status"]["containerStatuses"][0]
        if container and container != status["name"]:
            return 400, f"container {container} is not valid for pod {name}"
        run = status["restartCount"]
        if previous:
            if "terminated" not in status["lastState"]:
                return 400, f'previous terminated container "{status["name"]}" not found'
            return 200, f"{pod['metadata']['uid']}/{run - 1}"
        if "waiting" in status["state"] and "terminated" not in status["lastState"]:
            return 400, (f'container "{status["name"]}" in pod "{name}" is waiting to start: '
                         f'{status["state"]["waiting"]["reason"]}')
        return 200, f"{pod['metadata']['uid']}/{run}"

    def stream_log(self, http: Any, uid: str, run: int) -> None:
        """The run's log so far, then what is appended, until the run ends: its container
        terminated or restarted, its pod removed (or the emulator closed)."""
        http.send_response(200)
        http.send_header("Content-Type", "text/plain")
        http.send_header("Transfer-Encoding", "chunked")
        http.end_headers()
        sent = 0
        while True:
            with self.changed:
                data = self.runs[uid][run].encode()[sent:]
                over = self.closed or not data and not self.running(uid, run)
                if not data and not over:
                    self.changed.wait(timeout=1.0)
                    continue
            try:
                for start in range(0, len(data), self.chunk_size):
                    piece = data[start:start + self.chunk_size]
                    http.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(data)
                if over:
                    http.wfile.write(b"0\r\n\r\n")
                    return
            except OSError:  # the client went away (Ctrl-C)
                http.close_connection = True
                return

    @staticmethod
    def stamped(text: str, writes: list[tuple[int, float]]) -> str:
        """The log as the kubelet gives it with ``timestamps=true``: each line led by the time
        of the write that began it (RFC 3339 with nanoseconds) and a space."""
        out, start = [], 0
        for line in text.splitlines(keepends=True):
            when = next((at for end, at in writes if end > start), time.time())
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
            out.append(f"{stamp}.{int(when % 1 * 1e9):09d}Z {line}")
            start += len(line)
        return "".join(out)

    def write(self, uid: str, text: str, *, new_run: bool = False) -> None:
        """The container's run (a new one with ``new_run``) writes ``text`` now."""
        if new_run:
            self.runs.setdefault(uid, []).append("")
            self.writes.setdefault(uid, []).append([])
        self.runs[uid][-1] += text
        self.writes[uid][-1].append((len(self.runs[uid][-1]), self.clock()))

    def running(self, uid: str, run: int) -> bool:
        pod = next((p for pods in self.pods.values() for p in pods
                    if p["metadata"]["uid"] == uid), None)
        status = pod["status"]["containerStatuses"][0] if pod else None
        return bool(status and status["restartCount"] == run and "running" in status["state"])

    # -- what the kubelet and the operator would do (tests call these) --

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods.get(ns, []) if p["metadata"]["name"] == name), None)

    def operate(self, namespace: str, job: dict[str, Any]) -> None:
        """What the operator would do first: conditions, and the pods with a log line."""
        name = job["metadata"]["name"]
        job["status"] = {"conditions": [
            {"type": "Created", "status": "True", "reason": f"{job['kind']}Created"},
            {"type": "Running", "status": "True", "reason": f"{job['kind']}Running"}]}
        if job["kind"] != "PyTorchJob":
            return
        for kind, spec in job["spec"]["pytorchReplicaSpecs"].items():
            for index in range(int(spec.get("replicas", 1))):
                self.add_pod(namespace, f"{name}-{kind.lower()}-{index}",
                             {"training.kubeflow.org/job-name": name,
                              "training.kubeflow.org/replica-type": kind.lower(),
                              "training.kubeflow.org/replica-index": str(index)},
                             f"(the emulator's pod {name}-{kind.lower()}-{index})\n")

    def add_pod(self, namespace: str, name: str, labels: dict[str, str], log: str = "", *,
                container: str = "pytorch", waiting: bool = False) -> None:
        """A pod of one container, running with ``log`` written so far, or being created."""
        image = "torchjob:emulated"
        status = {"name": container, "image": image, "imageID": "", "restartCount": 0,
                  "ready": False, "started": False, "lastState": {},
                  "state": {"waiting": {"reason": "ContainerCreating"}}}
        uid = str(uuid.uuid4())
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "uid": uid,
                            "labels": labels, "creationTimestamp": _now()},
               "spec": {"containers": [{"name": container, "image": image}]},
               "status": {"phase": "Pending", "containerStatuses": [status]}}
        with self.changed:
            self.pods.setdefault(namespace, []).append(pod)
            self.write(uid, log, new_run=True)
            if not waiting:
                self.start(namespace, name)
            self.changed.notify_all()

    def start(self, namespace: str, name: str) -> None:
        """The container being created starts running."""
        with self.changed:
            pod = self.pod(namespace, name)
            assert pod is not None, name
            status = pod["status"]["containerStatuses"][0]
            status.update(ready=True, started=True, containerID=f"containerd://{uuid.uuid4().hex}",
                          imageID=f"{status['image']}@sha256:{'0' * 64}",
                          state={"running": {"startedAt": _now()}})
            pod["status"]["phase"] = "Running"
            self.changed.notify_all()

    def append_log(self, namespace: str, name: str, text: str) -> None:
        """The running container writes ``text``."""
        with self.changed:
            pod = self.pod(namespace, name)
            assert pod is not None, name
            self.write(pod["metadata"]["uid"], text)
            self.changed.notify_all()

    def restart(self, namespace: str, name: str, log: str = "", exit_code: int = 1) -> None:
        """The container exits with ``exit_code`` and the kubelet starts it again (restartCount
        goes up by one), writing ``log``."""
        with self.changed:
            pod = self.pod(namespace, name)
            assert pod is not None, name
            status = pod["status"]["containerStatuses"][0]
            status["lastState"] = {"terminated": self._terminated(status, exit_code)}
            status["restartCount"] += 1
            self.write(pod["metadata"]["uid"], log, new_run=True)
            self.start(namespace, name)

    def terminate(self, namespace: str, name: str, log: str = "", exit_code: int = 143) -> None:
        """What the kubelet does to a pod of a deleted job: its container, sent SIGTERM,
        writes ``log`` and exits with ``exit_code``."""
        with self.changed:
            pod = self.pod(namespace, name)
            assert pod is not None, name
            self.write(pod["metadata"]["uid"], log)
            status = pod["status"]["containerStatuses"][0]
            status.update(ready=False, state={"terminated": self._terminated(status, exit_code)})
            pod["status"]["phase"] = "Failed"
            self.changed.notify_all()

    def remove_pod(self, namespace: str, name: str) -> None:
        with self.changed:
            self.pods[namespace] = [p for p in self.pods.get(namespace, [])
                                    if p["metadata"]["name"] != name]
            self.changed.notify_all()

    def finish(self, namespace: str, name: str, succeeded: bool = True) -> None:
        """The job's containers exit (0, or 1 when it failed) and the operator marks the job
        Succeeded or Failed."""
        with self.changed:
            job = next(obj for (_, ns, n), obj in self.objects.items()
                       if (ns, n) == (namespace, name))
            for pod in self.pods.get(namespace, []):
                if name not in (pod["metadata"]["labels"].get(label) for label in JOB_LABELS):
                    continue
                status = pod["status"]["containerStatuses"][0]
                status.update(ready=False, state={
                    "terminated": self._terminated(status, 0 if succeeded else 1)})
                pod["status"]["phase"] = "Succeeded" if succeeded else "Failed"
            end = "Succeeded" if succeeded else "Failed"
            conditions = job.setdefault("status", {}).setdefault("conditions", [])
            for condition in conditions:
                if condition["type"] == "Running":
                    condition["status"] = "False"
            conditions.append({"type": end, "status": "True",
                               "reason": f"{job['kind']}{end}", "lastTransitionTime": _now()})
            self.changed.notify_all()

    @staticmethod
    def _terminated(status: dict[str, Any], exit_code: int) -> dict[str, Any]:
        started = status["state"].get("running", {}).get("startedAt", _now())
        return {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": started, "finishedAt": _now(),
                "containerID": status.get("containerID", "")}

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """Until ``predicate()`` (checked at each request and change) is true, at most
        ``timeout`` seconds; else an AssertionError that names ``what``."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not (value := predicate()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                self.changed.wait(left)
            return value

"""A Kubernetes API EMULATOR for the client tests: no API server can run on these machines.

It speaks real HTTP with the paths and JSON shapes of the API the client uses (namespaced
custom objects; pods by label selector; pod logs), keeps objects in memory, and can be told to
answer 403 to everything. It is not Kubernetes: no admission, no controllers; tests add the
pods and conditions an operator would create.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
CLUSTER_LIST = re.compile(r"^/apis/([^/]+)/([^/]+)/([^/]+)$")
LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


class Emulator:
    """``operator=True`` also plays a very small operator: each created job is Running at
    once, with one pod per replica whose log is one line (what a README session shows)."""

    def __init__(self, operator: bool = False) -> None:
        self.operator = operator
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self.pods: dict[str, list[dict[str, Any]]] = {}  # namespace -> pods
        self.pod_logs: dict[tuple[str, str], str] = {}
        self.forbidden = False
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, code: int, body: Any, text: bool = False) -> None:
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def status(self, code: int, reason: str) -> None:
                self.reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": reason, "code": code, "message": reason})

            def handle_any(self, method: str) -> None:
                if emulator.forbidden:
                    return self.status(403, "Forbidden")
                url = urlparse(self.path)
                if m := CUSTOM.match(url.path):
                    _, _, ns, plural, name = m.groups()
                    if method == "POST" and name is None:
                        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                        key = (plural, ns, body["metadata"]["name"])
                        if key in emulator.objects:
                            return self.status(409, "AlreadyExists")
                        emulator.objects[key] = body
                        if emulator.operator:
                            emulator.operate(ns, body)
                        return self.reply(201, body)
                    key = (plural, ns, name or "")
                    if key not in emulator.objects:
                        return self.status(404, "NotFound")
                    if method == "DELETE":
                        emulator.objects.pop(key)
                        return self.reply(200, {"kind": "Status", "status": "Success"})
                    return self.reply(200, emulator.objects[key])
                if (m := CLUSTER_LIST.match(url.path)) and method == "GET":
                    items = [obj for (plural, _, _), obj in sorted(emulator.objects.items())
                             if plural == m.group(3)]
                    return self.reply(200, {"kind": "List", "items": items})
                if m := PODS.match(url.path):
                    selector = parse_qs(url.query).get("labelSelector", [""])[0]
                    want = dict(part.split("=", 1) for part in selector.split(",") if part)
                    items = [p for p in emulator.pods.get(m.group(1), [])
                             if all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]
                    return self.reply(200, {"kind": "PodList", "apiVersion": "v1",
                                            "metadata": {}, "items": items})
                if m := LOG.match(url.path):
                    log = emulator.pod_logs.get((m.group(1), m.group(2)))
                    return self.status(404, "NotFound") if log is None else \
                        self.reply(200, log, text=True)
                return self.status(404, "NotFound")

            def do_GET(self) -> None:
                self.handle_any("GET")

            def do_POST(self) -> None:
                self.handle_any("POST")

            def do_DELETE(self) -> None:
                self.handle_any("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Emulator":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Any) -> str:
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
            f"clusters: [{{name: emu, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: emu, user: {token: emulator}}]\n"
            "contexts: [{name: emu, context: {cluster: emu, user: emu}}]\n")
        return str(path)

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

    def add_pod(self, namespace: str, name: str, labels: dict[str, str], log: str) -> None:
        self.pods.setdefault(namespace, []).append(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                             "labels": labels}})
        self.pod_logs[(namespace, name)] = log

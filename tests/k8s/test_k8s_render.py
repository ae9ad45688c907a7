"""The PyTorchJob and TrainJob renderers: whole manifests, shapes, and hostile input.

The rendered examples in k8s/manifests/ are this renderer's golden files. After an intended
change, regenerate them with one flag (or ``python -m torchjob.k8s.manifests``) and review the diff:

    TORCHJOB_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/k8s
"""

from __future__ import annotations

import copy
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchjob.jobs.command import agent_command
from torchjob.jobs.load import loads
from torchjob.jobs.values import SpecError, UserError
from torchjob.k8s.manifests import HERE as MANIFESTS
from torchjob.k8s.manifests import VARIANTS, render_variant, variant_spec
from torchjob.k8s.pod import (QUEUE_LABEL, WAIT_FOR_HOST, manifest_text, manifests_text, on_cluster,
                              shared_checkpoints)
from torchjob.k8s.pytorchjob import render_pytorchjob
from torchjob.k8s.render import render_manifest, render_objects
from torchjob.k8s.store import render_store
from torchjob.k8s.trainjob import render_trainjob
from torchjob.k8s.validate import validate, validate_text
from tests.golden import assert_golden
from tests.k8s.kubelet import Everything, expand
from tests.k8s.pods_operator import as_mutated, forbidden
from tests.procs import free_port, torchjob

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["a'; touch /tmp/pwned", 'b"; x; "', "$(touch /tmp/pwned)", "`id`", "two words",
           "new\nline", "tab\there", "caf\u00e9 \u65e5\u672c \U0001f600", "", "--x", "*",
           "${HOME}", "key: value", "- item", "# not a comment", "{a: 1}", "null", "true",
           "0x10", "'", "|", ">"]


def replicas(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["pytorchReplicaSpecs"])


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    pods = [rs["template"]["spec"] for rs in replicas(obj).values()]
    return [c for pod in pods for c in pod.get("initContainers", []) + pod["containers"]]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_manifests_match_the_renderer(name: str) -> None:
    """k8s/manifests/ is the golden set: whole files compared."""
    assert_golden(render_variant(name), MANIFESTS / name)


def test_no_stray_manifests() -> None:
    assert sorted(p.name for p in MANIFESTS.glob("*.yaml")) == sorted(VARIANTS)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_validates_and_round_trips(name: str) -> None:
    objs = VARIANTS[name][2](variant_spec(name))
    for obj in objs:
        assert validate(obj) == []
    assert list(yaml.safe_load_all(manifests_text(objs))) == objs
    assert validate_text(manifests_text(objs)) == []


def test_one_node_is_a_master_and_several_are_workers_meeting_at_the_store() -> None:
    """A fixed size of several nodes is Worker-only, as an elastic job: no Master, so the
    operator adds no init container (which would break Pod Security "restricted"), and the
    agents are clients of the job's own store ``<job>-rdzv``. One node: a Master whose agent
    serves its own store."""
    spec = loads("name: job\nnnodes: 3\nnproc_per_node: 2\nk8s: {pvc: runs}")
    obj = render_pytorchjob(spec)
    rs = replicas(obj)
    assert list(rs) == ["Worker"] and rs["Worker"]["replicas"] == 3
    assert rs["Worker"]["restartPolicy"] == "ExitCode"
    assert obj["spec"]["nprocPerNode"] == "2" and "elasticPolicy" not in obj["spec"]
    (container,) = containers(obj)
    assert container["command"][:5] == ["python", "-c", WAIT_FOR_HOST, "job-rdzv:29400", "600"]
    assert container["command"][5:] == list(agent_command(
        on_cluster(spec), python="python", rdzv_endpoint="job-rdzv:29400", run_id="job",
        store_client=True))  # the one agent command every backend runs
    assert [o["kind"] for o in render_objects(spec)] == ["PyTorchJob", "Deployment", "Service"]
    one = loads("name: job")
    assert list(replicas(render_pytorchjob(one))) == ["Master"] and render_store(one) == []
    (master,) = containers(render_pytorchjob(one))
    assert master["command"] == list(agent_command(one, python="python",
                                                   rdzv_endpoint="job-master-0:29400",
                                                   run_id="job"))


@pytest.mark.parametrize("text", ["nnodes: 2", "nnodes: 1:2", "nnodes: 2:4"])
def test_several_pods_need_a_shared_claim_for_checkpoints_or_say_pod_local(text: str) -> None:
    """Each pod's own disk would hold only its own files: a resume looks for another pod's
    (FileNotFoundError), and a recreated pod starts over. Refused, naming the field and both
    fixes; a ReadWriteMany claim (k8s.pvc, or a writable mount holding checkpoint_dir) or the
    acknowledged pod-local choice passes."""
    with pytest.raises(SpecError, match=r"^k8s\.pvc: is not set, but this job runs \d pods.*"
                       r"FileNotFoundError.*ReadWriteMany.*k8s\.checkpoints: pod-local"):
        render_objects(loads(f"name: job\n{text}"))
    assert render_objects(loads(f"name: job\n{text}\nk8s: {{pvc: runs}}"))
    assert render_objects(loads(f"name: job\n{text}\nk8s: {{checkpoints: pod-local}}"))
    mounted = f"name: job\n{text}\nmounts: [{{source: ckpt, target: /ckpt}}]\n"
    assert render_objects(loads(mounted + "checkpoint_dir: /ckpt/job"))
    with pytest.raises(SpecError, match=r"^k8s\.pvc: is not set"):  # not where it writes
        render_objects(loads(mounted + "checkpoint_dir: /ckptx/job"))
    with pytest.raises(SpecError, match=r"^k8s\.pvc: is not set"):  # read-only: not a home
        render_objects(loads(f"name: job\n{text}\ncheckpoint_dir: /ckpt/job\n"
                             "mounts: [{source: ckpt, target: /ckpt, read_only: true}]"))
    with pytest.raises(SpecError, match=r"^k8s\.checkpoints: 'pod-local' contradicts "
                       r"checkpoint_dir '/mnt/torchjob/runs/job/checkpoints'.*'runs'"):
        render_objects(loads(f"name: job\n{text}\nk8s: {{pvc: runs, checkpoints: pod-local}}"))
    assert shared_checkpoints(on_cluster(loads("name: job")), 1) is None  # one pod may


@pytest.mark.parametrize("render", [render_pytorchjob, render_trainjob])
@pytest.mark.parametrize("field,value,where", [
    ("run_dir", "../escape", "/mnt/escape"), ("checkpoint_dir", "../ck", "/mnt/ck"),
    ("run_dir", "a/../../x", "/mnt/x"), ("checkpoint_dir", "/mnt/torchjob/../ck", "/mnt/ck")])
def test_a_path_that_leaves_the_pvc_mount_is_refused(render: Any, field: str, value: str,
                                                     where: str) -> None:
    """Placed under k8s.pvc_mount_path, ``..`` would lead out of the claim: the pods would not
    share the directory and lose it, so it is refused (as docker refuses ``../``), naming it."""
    with pytest.raises(SpecError, match=rf"^{field}: '{re.escape(value)}' leaves "
                       rf"k8s\.pvc_mount_path \(/mnt/torchjob\).*resolves to {where},"):
        render(loads(f"name: job\n{field}: {value}\nk8s: {{pvc: runs}}"))


@pytest.mark.parametrize("render", [render_pytorchjob, render_trainjob])
def test_paths_under_the_mount_are_placed_as_before(render: Any) -> None:
    for text, run_dir in [("", "/mnt/torchjob/runs/job"),
                          ("run_dir: a/../b", "/mnt/torchjob/a/../b"),
                          ("run_dir: /mnt/torchjob/x", "/mnt/torchjob/x"),
                          ("run_dir: /data/x", "/data/x")]:  # one pod: pod-local, as before
        obj = render(loads(f"name: job\n{text}\nk8s: {{pvc: runs}}"))
        words = obj["spec"]["trainer"]["command"] if obj["kind"] == "TrainJob" else \
            containers(obj)[0]["command"]
        assert words[words.index("--run-dir") + 1] == run_dir, text
    assert render(loads("name: job\nnnodes: 2\nk8s: {pvc: runs, pvc_mount_path: /m/}"))


@pytest.mark.parametrize("render", [render_pytorchjob, render_trainjob])
def test_several_pods_with_checkpoints_beside_the_pvc_say_so(render: Any) -> None:
    """k8s.pvc is set, so "is not set" would mislead: the refusal names checkpoint_dir, where
    it is, and the mount it is not under."""
    with pytest.raises(SpecError, match=r"^checkpoint_dir: '/data/ck' lies outside "
                       r"k8s\.pvc_mount_path \(/mnt/torchjob\), where k8s\.pvc 'runs' is "
                       r"mounted, but this job runs 2 pods.*under /mnt/torchjob"):
        render(loads("name: job\nnnodes: 2\ncheckpoint_dir: /data/ck\nk8s: {pvc: runs}"))


def test_the_refusal_exits_2_before_anything_is_rendered_or_submitted() -> None:
    out = torchjob("render", "--to", "k8s", str(ROOT / "jobs" / "examples" / "default.yaml"),
                   "--set", "nnodes=2")
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.startswith("torchjob: k8s.pvc: is not set") and "Traceback" not in out.stderr
    out = torchjob("render", "--to", "k8s", str(ROOT / "jobs" / "examples" / "default.yaml"),
                   "--set", "k8s.pvc=runs", "--set", "run_dir=../escape")
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.startswith("torchjob: run_dir: '../escape' leaves k8s.pvc_mount_path")


def test_elastic_is_worker_only_meeting_at_its_own_store_service() -> None:
    """No Worker hosts the store: the agents are clients of ``<job>-rdzv`` (the Service of the
    store's Deployment), which the operator's PET_RDZV_ENDPOINT names too, and wait for it."""
    spec = loads("name: job\nnnodes: 2:4\nnproc_per_node: 3\nmax_restarts: 5\n"
                 "rdzv: {port: 29999}\nk8s: {pvc: runs}")
    obj = render_pytorchjob(spec)
    assert list(replicas(obj)) == ["Worker"] and replicas(obj)["Worker"]["replicas"] == 4
    assert obj["spec"]["elasticPolicy"] == {
        "minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "rdzvHost": "job-rdzv",
        "rdzvPort": 29999, "rdzvId": "job", "maxRestarts": 5}
    assert obj["spec"]["nprocPerNode"] == "3"
    (container,) = containers(obj)
    command = container["command"]
    assert command[:5] == ["python", "-c", WAIT_FOR_HOST, "job-rdzv:29999", "600"]
    assert command[5:] == list(agent_command(on_cluster(spec), python="python",
                                             rdzv_endpoint="job-rdzv:29999", run_id="job",
                                             store_client=True))
    assert command[command.index("--rdzv-conf") + 1].endswith(",is_host=false")
    assert "ports" not in container  # no Worker serves the store
    assert render_objects(spec)[0] == obj
    assert [o["kind"] for o in render_objects(spec)] == ["PyTorchJob", "Deployment", "Service"]
    assert render_store(loads("name: job\nnnodes: 1")) == []  # one pod: the Master's agent


def test_the_store_deployment_and_service() -> None:
    spec = loads("name: job\nnnodes: 1:2\nrdzv: {port: 29999}\nimage: reg/img:1\n"
                 "nproc_per_node: 2\nresources: {gpus: 2, cpu: 8}\n"
                 "k8s: {namespace: team, queue: q, "
                 "priority_class: high}")
    deployment, service = render_store(spec)
    ours = {"app.kubernetes.io/name": "job", "app.kubernetes.io/component": "rendezvous",
            "app.kubernetes.io/managed-by": "torchjob"}
    for obj in (deployment, service):
        assert obj["metadata"] == {"name": "job-rdzv", "namespace": "team", "labels": ours}
        assert validate(obj) == []
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two stores
    assert deployment["spec"]["selector"]["matchLabels"] == ours == service["spec"]["selector"]
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "reg/img:1"
    assert c["command"] == ["python", "-m", "torchjob.trainer.store", "--port", "29999"]
    assert c["resources"] == {"limits": {"memory": "512Mi"},
                              "requests": {"cpu": "100m", "memory": "256Mi"}}  # no GPU
    assert c["readinessProbe"]["tcpSocket"] == {"port": 29999}
    assert pod["priorityClassName"] == "high" and pod["automountServiceAccountToken"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "c10d", "port": 29999, "targetPort": 29999,
                                         "protocol": "TCP"}]
    assert "kueue.x-k8s.io/queue-name" not in deployment["metadata"]["labels"]


def test_an_elastic_name_leaves_room_for_the_store_service() -> None:
    fits = "j" + "x" * 57
    assert render_store(loads(f"name: {fits}\nnnodes: 1:2"))[1]["metadata"]["name"] \
        == fits + "-rdzv"
    for nnodes in ("1:2", "2"):  # every job of several pods has the store
        with pytest.raises(SpecError, match="at most 58"):
            render_store(loads(f"name: {fits}x\nnnodes: {nnodes}"))
        # through render_objects the Workers' <name>-worker-<i> is the tighter limit (54)
        with pytest.raises(SpecError, match="at most 54"):
            render_objects(loads(f"name: {fits}\nnnodes: {nnodes}\nk8s: {{pvc: runs}}"))
    assert render_store(loads(f"name: {fits}x\nnnodes: 1")) == []  # one pod: no store


def test_wait_for_host_waits_for_the_store_then_execs_with_argv_intact(tmp_path: Path) -> None:
    """It waits until HOST:PORT accepts a connection (not only resolves), then runs argv."""
    port = free_port()
    wait = subprocess.Popen([sys.executable, "-c", WAIT_FOR_HOST, f"localhost:{port}", "60",
                             sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b",
                             "$x"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait.stdout is not None
    line = wait.stdout.readline()  # it said it waits: nothing listens yet
    assert line.startswith(f"waiting for localhost:{port}: "), line
    with socket.create_server(("localhost", port)):
        out, err = wait.communicate(timeout=60)
    assert wait.returncode == 0 and out.strip() == "['a b', '$x']", (out, err)
    out = subprocess.run([sys.executable, "-c", WAIT_FOR_HOST, "no-such-host.invalid:1", "0",
                          "true"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no-such-host.invalid:1 did not answer in 0 s" in out.stderr


def test_pod_contents_resources_shm_pvc_secrets_and_security() -> None:
    spec = variant_spec("pytorchjob-gpu.yaml")
    obj = render_pytorchjob(spec)
    pod = replicas(obj)["Worker"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["name"] == "pytorch" and c["image"] == spec.image
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} \
        in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} \
        in c["env"]
    assert obj["metadata"]["labels"][QUEUE_LABEL] == "team-a-gpus"
    for each in containers(obj):
        sc = each["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0
    pvc = render_pytorchjob(variant_spec("pytorchjob-pvc.yaml"))
    pod = replicas(pvc)["Worker"]["template"]["spec"]
    assert {"name": "run", "persistentVolumeClaim": {"claimName": "digits-runs"}} in pod["volumes"]
    command = pod["containers"][0]["command"]
    assert command[command.index("--run-dir") + 1] == "/mnt/torchjob/runs/digits"
    policy = pvc["spec"]["runPolicy"]
    assert policy["schedulingPolicy"] == {"minAvailable": 2, "queue": "research"}
    assert policy["ttlSecondsAfterFinished"] == 86400 and policy["cleanPodPolicy"] == "All"


def test_trainjob_runs_the_agent_at_node_0_as_the_torch_plugin_names_it() -> None:
    spec = loads("name: job\nnnodes: 2\nnproc_per_node: 3\nresources: {gpus: 3}\n"
                 "k8s: {pvc: runs}")
    obj = render_trainjob(spec)
    trainer = obj["spec"]["trainer"]
    assert obj["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 3  # PET_* agree
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "3"
    host = "job-node-0-0.job"  # PET_MASTER_ADDR (torch.go)
    assert trainer["command"][:5] == ["python", "-c", WAIT_FOR_HOST, host, "600"]
    agent = agent_command(on_cluster(spec), python="python", rdzv_endpoint=f"{host}:29400",
                          run_id="job")
    assert trainer["command"][5:] == list(agent)
    assert agent[agent.index("--run-dir") + 1] == "/mnt/torchjob/runs/job"


def test_trainjob_agent_keeps_watchdog_retries_and_storm_guard() -> None:
    spec = loads("name: job\nretry_on_error: true\nmax_stalled_restarts: 5\n"
                 "hang_timeout: 600\ncollective_timeout: 900\nresume: force")
    command = render_trainjob(spec)["spec"]["trainer"]["command"]
    words = command[command.index("torchjob.trainer.agent"):command.index("--nnodes")]
    assert words == ["torchjob.trainer.agent", "--run-dir", "runs/job", "--checkpoint-dir",
                     "runs/job/checkpoints", "--retry-on-error", "--resume", "force",
                     "--max-stalled-restarts", "5", "--hang-timeout", "600",
                     "--collective-timeout", "900"]


def test_trainjob_pod_settings_are_one_runtime_patch_of_allowed_fields() -> None:
    spec = loads("name: job\nnnodes: 2\nresources: {shm: 2Gi, cpu: 2, memory: 4Gi}\n"
                 "env: {A: b}\nsecrets: [{env: HF_TOKEN, secret: hf, key: token}]\n"
                 "mounts: [{source: data, target: /data, read_only: true}]\n"
                 "k8s: {pvc: runs, service_account: trainer, queue: gpus, run_as_user: 4242,"
                 " fs_group: 4243, active_deadline_seconds: 99}")
    obj = render_trainjob(spec)
    assert obj["metadata"]["labels"][QUEUE_LABEL] == "gpus"  # Kueue reads the TrainJob's
    assert obj["spec"]["activeDeadlineSeconds"] == 99
    trainer = obj["spec"]["trainer"]
    assert [e["name"] for e in trainer["env"]] == ["OMP_NUM_THREADS", "A", "HF_TOKEN"]
    assert trainer["env"][2]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert trainer["resourcesPerNode"] == {"limits": {"memory": "4Gi"},
                                           "requests": {"cpu": "2", "memory": "4Gi"}}
    [patch] = obj["spec"]["runtimePatches"]
    assert re.fullmatch(r"[a-z0-9.-]+\.[a-z]+/[a-z0-9./-]+", patch["manager"])  # domain/path
    [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    pod = job["template"]["spec"]["template"]["spec"]
    # Only PodSpecPatch / ContainerPatch fields (trainjob_types.go); no env on node.
    assert set(pod) == {"serviceAccountName", "securityContext", "volumes", "containers",
                        "terminationGracePeriodSeconds"}
    [node] = pod["containers"]
    assert set(node) == {"name", "volumeMounts", "securityContext"} and node["name"] == "node"
    assert pod["serviceAccountName"] == "trainer"
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 4242,
                                      "runAsGroup": 4242, "fsGroup": 4243,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert node["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True, "runAsUser": 4242, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
        {"name": "run", "persistentVolumeClaim": {"claimName": "runs"}},
        {"name": "mount-0", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}}]
    assert node["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"}, {"name": "run", "mountPath": "/mnt/torchjob"},
        {"name": "mount-0", "mountPath": "/data", "readOnly": True}]
    assert validate(obj) == []


def test_a_one_node_trainjob_needs_no_pvc() -> None:
    obj = render_trainjob(loads("name: job"))
    pod = obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod and [v["name"] for v in pod["volumes"]] == ["dshm"]
    assert "activeDeadlineSeconds" not in obj["spec"] and validate(obj) == []


@pytest.mark.parametrize("text, path, message", [
    ("nnodes: 1:2", "nnodes", r"'1:2' is elastic, .*no elastic training.*--to k8s.*nnodes such "
     r"as 2"),
    ("nnodes: 2", "k8s.pvc", r"is not set, but this job runs 2 pods .* ReadWriteMany PersistentVolumeClaim"),
])
def test_trainjob_refuses_what_v2_3_cannot_honour(text: str, path: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as caught:
        render_trainjob(loads(f"name: job\n{text}"))
    assert caught.value.path == path


STOCK_RUNTIME = ROOT / "k8s" / "schemas" / "runtime_torch_distributed.yaml"


def test_a_volcano_trainjob_comes_after_a_runtime_of_its_own() -> None:
    """v2.3's Volcano plugin acts only for a runtime with podGroupPolicy.volcano and reads the
    queue from its template's annotation, the priority from its pod template: the job gets
    the vendored torch-distributed with those, namespaced, labelled as the job, and refers
    to it; the two documents pass everything, the job's pods Pod Security "restricted"."""
    spec = loads("name: job\nk8s: {namespace: team-a, volcano_queue: research, "
                 "priority_class: high}")
    runtime, job = render_objects(spec, "trainjob")
    assert runtime["metadata"] == {
        "name": "job-runtime", "namespace": "team-a",
        "labels": {"trainer.kubeflow.org/framework": "torch", "app.kubernetes.io/name": "job",
                   "app.kubernetes.io/managed-by": "torchjob"}}
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime", "name": "job-runtime"}
    body = copy.deepcopy(runtime["spec"])
    assert body.pop("podGroupPolicy") == {"volcano": {}}
    assert body["template"].pop("metadata") == {
        "annotations": {"scheduling.volcano.sh/queue-name": "research"}}
    pod = body["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert (pod.pop("schedulerName"), pod.pop("priorityClassName")) == ("volcano", "high")
    assert pod.pop("securityContext")["runAsNonRoot"] is True
    assert pod["containers"][0].pop("securityContext")["allowPrivilegeEscalation"] is False
    assert body == yaml.safe_load(STOCK_RUNTIME.read_text())["spec"]  # the rest: the stock one
    text = manifests_text([runtime, job])
    assert validate_text(text, runtime_pods=True) == []
    assert render_manifest(spec, "trainjob") == text


def test_a_priority_alone_needs_no_volcano_and_neither_the_stock_runtime() -> None:
    runtime, job = render_objects(loads("name: job\nk8s: {priority_class: high}"), "trainjob")
    assert "podGroupPolicy" not in runtime["spec"] and "metadata" not in runtime["spec"][
        "template"]
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]
    assert pod["priorityClassName"] == "high" and "schedulerName" not in pod
    assert job["spec"]["runtimeRef"]["name"] == "job-runtime"
    [plain] = render_objects(loads("name: job\nk8s: {queue: q}\nresources: {cpu: 1, "
                                   "memory: 1Gi}"), "trainjob")
    assert plain["spec"]["runtimeRef"] == {"name": "torch-distributed"}


def test_the_longest_trainjob_name_leaves_room_for_its_runtime() -> None:
    """The pods' names bind first (k8s.render.check_names): <job>-runtime is a DNS label."""
    longest = "a" * 48
    runtime, _ = render_objects(loads(f"name: {longest}\nk8s: {{volcano_queue: q}}"),
                                "trainjob")
    assert len(runtime["metadata"]["name"]) <= 63
    with pytest.raises(SpecError, match="at most 48 characters"):
        render_objects(loads(f"name: {longest}a\nk8s: {{volcano_queue: q}}"), "trainjob")


def test_host_path_mounts_are_refused_on_kubernetes() -> None:
    with pytest.raises(SpecError, match=r"^mounts\[0\]\.source: .*hostPath"):
        render_pytorchjob(loads("name: job\nmounts: [{source: /data, target: /data}]"))
    obj = render_pytorchjob(loads("name: job\nmounts: [{source: data, target: /data, "
                                  "read_only: true}]"))
    assert validate(obj) == []


@pytest.mark.parametrize("field, value", [
    ("name", "a'; rm -rf /"), ("name", "Digits"), ("name", "x" * 64), ("name", "a\nb"),
    ("k8s.namespace", "ns; x"), ("k8s.pvc", "data/../x"), ("k8s.queue", "$(id)"),
    ("image", "img\nname"), ("k8s.service_account", "A B"), ("k8s.run_as_user", 0)])
def test_hostile_names_are_rejected_at_the_spec(field: str, value: object) -> None:
    with pytest.raises(SpecError) as caught:
        loads("name: job", [f"{field}={json.dumps(value)}"])
    assert caught.value.path == field


def test_hostile_values_are_escaped_and_survive_yaml_exactly() -> None:
    quoted = [json.dumps(v, ensure_ascii=False) for v in HOSTILE]
    spec = loads("name: job\nnnodes: 1:2\ntrainer: {module: tool}\nk8s: {pvc: runs}",
                 [f"env.V{i}={q}" for i, q in enumerate(quoted)]
                 + [f"trainer.args.a{i}={q}" for i, q in enumerate(quoted)])
    for obj in (render_pytorchjob(spec), render_trainjob(loads(
            "name: job\nnnodes: 2\nk8s: {pvc: runs}\ntrainer: {module: tool}",
            [f"env.V{i}={q}" for i, q in enumerate(quoted)]))):
        text = manifest_text(obj)
        assert yaml.safe_load(text) == obj
        assert validate(obj) == []
    c = containers(render_pytorchjob(spec))[0]
    seen = Everything()  # the kubelet's $(VAR) expansion (emulated), every variable defined
    assert [expand(e["value"], seen) for e in c["env"] if e["name"] != "OMP_NUM_THREADS"] \
        == HOSTILE
    tail = [expand(word, seen) for word in c["command"][-2 * len(HOSTILE):]]
    assert tail[1::2] == HOSTILE  # every value one argv word, never through a shell


def test_render_manifest_validates_before_it_prints() -> None:
    spec = loads("name: job\nnnodes: 2\nk8s: {pvc: runs}")
    assert yaml.safe_load(render_manifest(spec, "trainjob"))["kind"] == "TrainJob"
    one = loads("name: job")
    assert render_manifest(one) == manifest_text(render_pytorchjob(one))
    with pytest.raises(SpecError, match=r"^env.HF_TOKEN: .*credential.*secrets: "):
        render_manifest(loads("name: job\nenv: {HF_TOKEN: hf_abcdefghijkl}"))
    with pytest.raises(UserError, match=r"valid: pytorchjob, trainjob"):
        render_manifest(spec, "mpijob")


# (target, nnodes, the longest name that fits): 63 minus what the operator appends
NAME_LIMITS = [("pytorchjob", "1", 54),        # <name>-master-0
               ("pytorchjob", "10", 54),       # <name>-worker-9 (Worker-only: no Master)
               ("pytorchjob", "11", 53),       # <name>-worker-10
               ("pytorchjob", "1:10", 54),     # <name>-worker-9 (and <name>-rdzv: 58)
               ("pytorchjob", "1:11", 53),     # <name>-worker-10
               ("trainjob", "10", 48),         # <name>-node-0-9-abcde
               ("trainjob", "11", 47)]         # <name>-node-0-10-abcde


@pytest.mark.parametrize("target,nnodes,limit", NAME_LIMITS)
def test_names_fit_the_pods_and_services_the_operators_derive(target: str, nnodes: str,
                                                              limit: int) -> None:
    fits = "j" * limit
    shared = "\nk8s: {pvc: runs}"  # several nodes keep their checkpoints on a shared claim
    objs = render_objects(loads(f"name: {fits}\nnnodes: '{nnodes}'{shared}"), target)
    assert objs[0]["metadata"]["name"] == fits
    with pytest.raises(SpecError, match=rf"^name: 'j+' is {limit + 1} characters: .* at most "
                                        rf"63; use a name of at most {limit} characters$"):
        render_objects(loads(f"name: {fits}j\nnnodes: '{nnodes}'{shared}"), target)


def test_kueue_needs_requests_and_places_by_topology() -> None:
    base = "name: job\nnnodes: 3\nk8s: {queue: q, topology: {level: x.io/rack}, pvc: runs}\n"
    with pytest.raises(SpecError, match=r"^resources.cpu: is unset, but k8s.queue 'q' .*"
                                        r"set resources.cpu"):
        render_objects(loads(base))
    with pytest.raises(SpecError, match=r"^resources.memory: is unset"):
        render_objects(loads(base + "resources: {cpu: 2}"))
    job = render_objects(loads(base + "resources: {cpu: 2, memory: 4Gi}"))[0]
    for rs in replicas(job).values():
        assert rs["template"]["metadata"]["annotations"] == {  # Worker-only: one PodSet
            "kueue.x-k8s.io/podset-required-topology": "x.io/rack"}
        assert rs["template"]["spec"]["containers"][0]["resources"]["requests"] == {
            "cpu": "2", "memory": "4Gi"}
    elastic = render_objects(loads(
        "name: job\nnnodes: 1:3\nresources: {cpu: 2, memory: 4Gi}\n"
        "k8s: {queue: q, topology: {level: rack, mode: preferred}, pvc: runs}"))[0]
    assert replicas(elastic)["Worker"]["template"]["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-preferred-topology": "rack"}
    with pytest.raises(SpecError, match=r"^<string>: k8s.topology: needs k8s.queue"):
        loads("name: job\nk8s: {topology: {level: rack}}")
    with pytest.raises(SpecError, match=r"^<string>: k8s.volcano_queue: 'v' and k8s.queue "
                                        r"'q' are both"):
        loads("name: job\nk8s: {queue: q, volcano_queue: v}")
    # a TrainJob: on the node pods' template of its own TrainingRuntime
    runtime, trainjob = render_objects(loads(base.replace("3", "2") + "resources: {cpu: 2, "
                                             "memory: 4Gi}"), "trainjob")
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                              "kind": "TrainingRuntime", "name": "job-runtime"}
    (node,) = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]
               if j["name"] == "node"]
    assert node["template"]["spec"]["template"]["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "x.io/rack"}


def test_literal_secrets_by_an_explicit_rule_with_an_opt_out() -> None:
    """Refused: a literal value of a variable whose name ends in _KEY, _TOKEN, _SECRET,
    _PASSWORD (or a value shaped like a token); TOKEN_BUDGET and MAX_TOKENS are not secrets."""
    for name in ("TOKEN_BUDGET", "MAX_TOKENS", "KEYBOARD", "SECRETS_DIR", "PASSWORD_MIN_LEN"):
        render_objects(loads(f"name: job\nenv: {{{name}: '5'}}"))
    for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "TOKEN"):
        with pytest.raises(SpecError, match=rf"^env.{name}: has a literal value, .* secrets: "
                                            rf".*k8s.allow_literal_env: \[{name}\]$"):
            render_objects(loads(f"name: job\nenv: {{{name}: abc}}"))
    ok = loads("name: job\nenv: {SORT_KEY: abc}\nk8s: {allow_literal_env: [SORT_KEY]}")
    assert {"name": "SORT_KEY", "value": "abc"} in containers(render_objects(ok)[0])[0]["env"]
    render_objects(loads("name: job\nenv: {HF_TOKEN: ''}"))  # empty: nothing to hide


@pytest.mark.parametrize("text", ["nnodes: 1", "nnodes: 2", "nnodes: 3", "nnodes: 1:2",
                                  "nnodes: 2\nnproc_per_node: 4\nresources: {gpus: 4}"])
def test_every_pod_passes_restricted_as_the_operator_mutates_it(text: str) -> None:
    """Pod Security "restricted" on the pods as the operator creates them (its init container
    added, exactly when release-1.9 adds one: a Worker pod of a job with a Master), and on the
    store's. The renderer's jobs get none; a hand-written Master + Worker job's Workers do,
    and a namespace enforcing "restricted" refuses them."""
    objs = render_objects(loads(f"name: job\n{text}\nk8s: {{pvc: runs}}"))
    assert all("initContainers" not in pod for pod in pod_templates(as_mutated(objs[0])))
    assert forbidden(objs) == []
    legacy = copy.deepcopy(objs[0])
    worker = replicas(legacy).get("Worker") or replicas(legacy)["Master"]
    legacy["spec"]["pytorchReplicaSpecs"] = {"Master": {**copy.deepcopy(worker), "replicas": 1},
                                             "Worker": worker}
    legacy["spec"].pop("elasticPolicy", None)
    assert validate(legacy) == []  # as submitted: fine
    (init,) = as_mutated(legacy)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "initContainers"]
    assert init["image"] == "alpine:3.10" and "job-master-0" in init["command"][2]
    problems = forbidden([legacy])
    assert problems and all("Worker.template.spec.initContainers[0]" in p for p in problems)
    assert any("allowPrivilegeEscalation" in p for p in problems)


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [rs["template"]["spec"] for rs in replicas(obj).values()]

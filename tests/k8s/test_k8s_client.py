"""The Kubernetes client over real HTTP, against an API EMULATOR (tests/k8s/emulator.py):
no API server can run on these machines. create, status, logs, delete, and the API errors."""

from __future__ import annotations

import os
import json
import re
import time
from pathlib import Path

import pytest
import yaml

from tests.k8s.emulator import Emulator
from tests.procs import torchjob
from torchjob.trainer.contract import log_prefix
from torchjob.trainer.report import progress_line

PODS = "pytorchjobs"


@pytest.fixture
def emulator(tmp_path: Path) -> Emulator:
    with Emulator() as emu:
        emu.config = emu.kubeconfig(tmp_path / "kubeconfig")  # type: ignore[attr-defined]
        yield emu


def test_submit_status_logs_cancel(emulator: Emulator) -> None:
    env = {**os.environ, "KUBECONFIG": emulator.config}  # type: ignore[attr-defined]
    sub = torchjob("submit", "--to", "k8s", "jobs/examples/default.yaml", env=env)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.strip() == "k8s:default/digits"  # the handle names its backend
    created = emulator.objects[(PODS, "default", "digits")]
    assert created["kind"] == "PyTorchJob" and created["spec"]["pytorchReplicaSpecs"]

    # what the operator would do: conditions and pods
    created["status"] = {"conditions": [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}]}
    for kind, index, line in (("Worker", "0", "step 10 from worker"),
                              ("Master", "0", "step 10 from master")):
        emulator.add_pod("default", f"digits-{kind.lower()}-{index}",
                         {"training.kubeflow.org/job-name": "digits",
                          "training.kubeflow.org/replica-type": kind.lower(),
                          "training.kubeflow.org/replica-index": index}, line + "\n")
    status = torchjob("status", "k8s:default/digits", env=env)
    assert status.returncode == 0 and status.stdout.startswith("k8s:default/digits: RUNNING")
    assert "Running=True PyTorchJobRunning" in status.stdout
    as_json = json.loads(torchjob("status", "--json", "k8s:default/digits", env=env).stdout)
    assert as_json["state"] == "RUNNING" and as_json["handle"] == "k8s:default/digits"
    listed = json.loads(torchjob("list", "--to", "k8s", "--json", env=env).stdout)
    assert [(j["handle"], j["state"]) for j in listed] == [("k8s:default/digits", "RUNNING")]
    logs = torchjob("logs", "--to", "k8s", "digits", env=env)
    assert logs.stdout.splitlines() == ["[node 0] step 10 from master",
                                        "[node 1] step 10 from worker"]
    cancel = torchjob("cancel", "--to", "k8s", "default/digits", env=env)
    assert cancel.returncode == 0 and (PODS, "default", "digits") not in emulator.objects


def test_status_reads_the_progress_from_the_pods_logs(emulator: Emulator) -> None:
    """No run directory here: the trainer's progress and eval lines (their one format,
    trainer.report) and the agents' lines in the pods' logs give the step, the ETA, the
    restarts (the workers' attempt) and the last failure. The kubelet's stamps say when the
    lines were written (20 s ago here): the ETA is aged from then."""
    env = {**os.environ, "KUBECONFIG": emulator.config}  # type: ignore[attr-defined]
    assert torchjob("submit", "--to", "k8s", "jobs/examples/default.yaml", env=env).returncode == 0
    emulator.objects[(PODS, "default", "digits")]["status"] = {"conditions": [
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}]}
    rank0 = "07:00:00 [rank 0/4] "
    master = [log_prefix(0, 0, 0) + rank0 + progress_line(10, 88, {"loss": 0.9, "eta_s": 40}),
              "W1127 07:00:01 torchjob: node 0 rank 1 was killed by SIGKILL: restarting the "
              "workers",
              log_prefix(0, 0, 1) + rank0 + "eval at step 22: loss 0.4000 accuracy 0.9100",
              log_prefix(0, 0, 1) + rank0 + progress_line(30, 88, {
                  "loss": 0.25, "lr": 0.001, "epoch": 1, "samples_per_s": 950.0, "eta_s": 61})]
    written = time.time() - 20
    emulator.clock = lambda: written
    for kind, lines in (("master", master), ("worker", [log_prefix(1, 2, 1) + "hello"])):
        emulator.add_pod("default", f"digits-{kind}-0", {
            "training.kubeflow.org/job-name": "digits",
            "training.kubeflow.org/replica-type": kind,
            "training.kubeflow.org/replica-index": "0"}, "\n".join(lines) + "\n")
    shown = torchjob("status", "k8s:default/digits", env=env)
    *_, where, figures, restarts = shown.stdout.splitlines()
    aged = re.fullmatch(r"  progress: step 30/88 \(34%\), epoch 1, 950 samples/s, "
                        r"ETA 0:00:(\d\d) \(updated (\d+) s ago\)", where)
    assert aged and int(aged[1]) <= 41 and int(aged[2]) >= 20, shown.stdout
    assert (figures, restarts) == (
        "  loss 0.25; eval at step 22: loss 0.4, accuracy 0.91",
        "  restarts: 1; the last failure: node 0 rank 1 was killed by SIGKILL"), shown.stdout
    told = json.loads(torchjob("status", "--json", "k8s:default/digits", env=env).stdout)
    assert {k: told[k] for k in ("state", "step", "total_steps", "restarts",
                                 "progress_source")} == {
        "state": "RUNNING", "step": 30, "total_steps": 88, "restarts": 1,
        "progress_source": "logs"}, told
    assert abs(told["updated"] - written) < 1e-3, told  # the kubelet's stamp, to its nanosecond
    assert 61 - (time.time() - written) <= told["eta"] <= 41, told  # aged since its line


def test_an_elastic_job_is_submitted_and_cancelled_with_its_rendezvous_store(
        emulator: Emulator) -> None:
    """The PyTorchJob, then its store's Deployment and Service exactly as rendered, each owned
    by the job (the uid the server gave it); cancel deletes all three, and leaves alone a
    Service of the same name that is not this job's store."""
    env = {**os.environ, "KUBECONFIG": emulator.config}  # type: ignore[attr-defined]
    rendered = torchjob("render", "--to", "k8s", "jobs/examples/elastic.yaml", env=env)
    assert rendered.returncode == 0, rendered.stderr
    sub = torchjob("submit", "--to", "k8s", "jobs/examples/elastic.yaml", env=env)
    assert sub.returncode == 0, sub.stderr
    job = emulator.objects[(PODS, "default", "digits-elastic")]
    deployment = emulator.objects[("deployments", "default", "digits-elastic-rdzv")]
    service = emulator.objects[("services", "default", "digits-elastic-rdzv")]
    owner = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "digits-elastic",
              "uid": job["metadata"]["uid"]}]
    sent = [job, deployment, service]
    for obj in sent:
        if obj is not job:
            assert obj["metadata"].pop("ownerReferences") == owner
        obj["metadata"].pop("uid")
    assert sent == list(yaml.safe_load_all(rendered.stdout))  # what render showed, was sent
    assert job["spec"]["elasticPolicy"]["rdzvHost"] == "digits-elastic-rdzv"
    cancel = torchjob("cancel", "k8s:default/digits-elastic", env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert "Deployment default/digits-elastic-rdzv" in cancel.stdout
    assert not emulator.objects

    assert torchjob("submit", "--to", "k8s", "jobs/examples/default.yaml",
                    env=env).returncode == 0  # fixed size: no store; a stranger's Service stays
    emulator.objects[("services", "default", "digits-rdzv")] = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "digits-rdzv"},
        "spec": {"ports": [{"port": 1}]}}
    assert torchjob("cancel", "k8s:default/digits", env=env).returncode == 0
    assert list(emulator.objects) == [("services", "default", "digits-rdzv")]


def test_a_volcano_trainjob_is_submitted_after_its_runtime_and_cancelled_with_it(
        emulator: Emulator) -> None:
    """The job's own TrainingRuntime first (the TrainJob webhook wants it to exist), then the
    TrainJob, as rendered; the runtime is then owned by the job. Cancel deletes both; a job
    the server refuses leaves no runtime behind."""
    env = {**os.environ, "KUBECONFIG": emulator.config}  # type: ignore[attr-defined]
    argv = ["--to", "k8s:trainjob", "--set", "k8s.volcano_queue=research",
            "jobs/examples/default.yaml"]
    rendered = torchjob("render", *argv, env=env)
    assert rendered.returncode == 0, rendered.stderr
    sub = torchjob("submit", *argv, env=env)
    assert sub.returncode == 0 and sub.stdout.strip() == "k8s:trainjob:default/digits", sub.stderr
    runtime = emulator.objects[("trainingruntimes", "default", "digits-runtime")]
    job = emulator.objects[("trainjobs", "default", "digits")]
    assert runtime["metadata"].pop("ownerReferences") == [
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "digits",
         "uid": job["metadata"]["uid"]}]
    for obj in (runtime, job):
        obj["metadata"].pop("uid")
    assert [runtime, job] == list(yaml.safe_load_all(rendered.stdout))
    cancel = torchjob("cancel", "k8s:trainjob:default/digits", env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert "TrainingRuntime default/digits-runtime" in cancel.stdout and not emulator.objects

    emulator.objects[("trainjobs", "default", "digits")] = job  # someone else's, by that name
    again = torchjob("submit", *argv, env=env)
    assert again.returncode == 2 and "HTTP 409" in again.stderr, again.stderr
    assert list(emulator.objects) == [("trainjobs", "default", "digits")]


def test_api_errors_are_one_clear_line_and_exit_2(emulator: Emulator, tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": emulator.config}  # type: ignore[attr-defined]
    assert torchjob("submit", "--to", "k8s", "jobs/examples/default.yaml", env=env).returncode == 0
    again = torchjob("submit", "--to", "k8s", "jobs/examples/default.yaml", env=env)
    assert again.returncode == 2 and "HTTP 409" in again.stderr and "already exists" in again.stderr
    missing = torchjob("status", "--to", "k8s", "default/nope", env=env)
    assert missing.returncode == 2 and "HTTP 404" in missing.stderr
    emulator.forbidden = True
    denied = torchjob("cancel", "--to", "k8s", "default/digits", env=env)
    assert denied.returncode == 2 and "HTTP 403" in denied.stderr and "RBAC" in denied.stderr
    for proc in (again, missing, denied):
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_unreachable_server_and_no_config(tmp_path: Path) -> None:
    dead = tmp_path / "dead"
    dead.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
                    "clusters: [{name: x, cluster: {server: 'http://127.0.0.1:9'}}]\n"
                    "users: [{name: x, user: {token: t}}]\n"
                    "contexts: [{name: x, context: {cluster: x, user: x}}]\n")
    proc = torchjob("status", "--to", "k8s", "digits",
                    env={**os.environ, "KUBECONFIG": str(dead)})
    assert proc.returncode == 2 and "cannot be reached" in proc.stderr, proc.stderr
    none = torchjob("status", "--to", "k8s", "digits",
                    env={**os.environ, "KUBECONFIG": str(tmp_path / "absent")})
    assert none.returncode == 2 and "no Kubernetes cluster configured" in none.stderr


@pytest.mark.parametrize("text,says", [
    ("garbage: [\n", "ParserError"),  # not YAML
    ("- a\n", "TypeError"),  # not a mapping
    ("apiVersion: v1\nkind: Config\nclusters: 5\ncurrent-context: x\n", "TypeError"),
    ("apiVersion: v1\nkind: Config\ncurrent-context: nope\nclusters: [{name: x, cluster: "
     "{server: 'http://127.0.0.1:9'}}]\nusers: [{name: x, user: {token: t}}]\n"
     "contexts: [{name: x, context: {cluster: x, user: x}}]\n", "name nope"),  # no such context
    (None, "IsADirectoryError")])
def test_a_damaged_kubeconfig_is_named_with_its_fault(tmp_path: Path, text: str | None,
                                                       says: str) -> None:
    """Not a traceback, nor 'no cluster configured' (the in-cluster fallback's words): the
    file KUBECONFIG names, and what is wrong with it. Nothing is submitted."""
    config = tmp_path / "kubeconfig"
    if text is None:
        config.mkdir()
    else:
        config.write_text(text)
    proc = torchjob("submit", "--to", "k8s", "jobs/examples/default.yaml",
                    env={**os.environ, "KUBECONFIG": str(config)})
    assert proc.returncode == 2 and f"the kubeconfig {config} cannot be used" in proc.stderr \
        and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

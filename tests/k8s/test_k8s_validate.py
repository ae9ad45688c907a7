"""Validation of hand-written manifests: the Kubeflow documentation's shapes pass, broken ones
are rejected with the rule and field path named. No API server: the upstream CRDs vendored in
k8s/schemas/ and the admission rules of K8S-CONTRACT.md are the reference."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import yaml

from torchjob.k8s.validate.schema import check
from torchjob.k8s.validate import Problem, looks_secret, validate, validate_text

RESTRICTED = """
          securityContext:
            runAsNonRoot: true
            runAsUser: 1000
            seccompProfile: {type: RuntimeDefault}
"""
CONTAINER_SC = """
              securityContext:
                allowPrivilegeEscalation: false
                capabilities: {drop: [ALL]}
"""
# The shape of kubeflow's examples/pytorch/simple.yaml (static, with a Master).
STATIC = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: pytorch-simple
  namespace: kubeflow
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:%(pod)s
          containers:
            - name: pytorch
              image: docker.io/kubeflowkatib/pytorch-mnist:v1beta1-45c5727
              imagePullPolicy: Always
              command: ["python3", "/opt/pytorch-mnist/mnist.py", "--epochs=1"]%(c)s
    Worker:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:%(pod)s
          containers:
            - name: pytorch
              image: docker.io/kubeflowkatib/pytorch-mnist:v1beta1-45c5727
              imagePullPolicy: Always
              command: ["python3", "/opt/pytorch-mnist/mnist.py", "--epochs=1"]%(c)s
"""
# The shape of the elastic echo / imagenet examples (Worker-only with elasticPolicy).
ELASTIC = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: elastic-example-imagenet
spec:%(nproc)s
  elasticPolicy:
    rdzvBackend: c10d
    minReplicas: 1
    maxReplicas: 2
    maxRestarts: 100
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      restartPolicy: OnFailure
      template:
        spec:%(pod)s
          containers:
            - name: pytorch
              image: kubeflow/pytorch-elastic-example-imagenet:latest
              imagePullPolicy: IfNotPresent
              env:
                - name: LOGLEVEL
                  value: DEBUG
              command: ["python", "-m", "torch.distributed.run", "/workspace/examples/imagenet.py",
                        "--arch=resnet18", "--epochs=20", "--batch-size=32"]
              resources:
                limits: {nvidia.com/gpu: 1}%(c)s
"""
TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: pytorch-distributed
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    image: docker.io/kubeflow/pytorch-mnist:latest
    command: [torchrun, /workspace/mnist.py]
    numNodes: 2
    resourcesPerNode:
      limits: {nvidia.com/gpu: 1}
"""


def static(restricted: bool = True) -> dict[str, Any]:
    return dict(yaml.safe_load(STATIC % {"pod": RESTRICTED if restricted else "",
                                         "c": CONTAINER_SC if restricted else ""}))


def elastic(nproc: str = "", restricted: bool = True) -> dict[str, Any]:
    text = ELASTIC % {"nproc": nproc, "pod": RESTRICTED if restricted else "",
                      "c": CONTAINER_SC if restricted else ""}
    return dict(yaml.safe_load(text))


def rules(problems: list[Problem]) -> set[tuple[str, str]]:
    return {(p.rule, p.path) for p in problems}


@pytest.mark.parametrize("make", [
    static, elastic, lambda: elastic('\n  nprocPerNode: "4"'),
    lambda: yaml.safe_load(TRAINJOB)], ids=["static", "elastic", "elastic-nproc", "trainjob"])
def test_documented_shapes_validate(make: Callable[[], dict[str, Any]]) -> None:
    assert validate(make()) == []


def test_documented_shapes_without_security_context_fail_only_pod_security() -> None:
    for obj in (static(restricted=False), elastic(restricted=False)):
        assert validate(obj, pod_security=False) == []
        problems = validate(obj)  # a report apart from the verdict: layer "restricted"
        assert problems and {p.rule for p in problems} == {"pod-security"}
        assert {p.layer for p in problems} == {"restricted"}
        assert all(str(p).startswith("restricted: ") for p in problems)
        assert ("pod-security", "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0]"
                ".securityContext.allowPrivilegeEscalation") in rules(problems)


def broken(edit: Callable[[dict[str, Any]], object], base: Callable[[], dict[str, Any]] = static,
           ) -> list[Problem]:
    obj = copy.deepcopy(base())
    edit(obj)
    return validate(obj)


W = "spec.pytorchReplicaSpecs.Worker"
M = "spec.pytorchReplicaSpecs.Master"


@pytest.mark.parametrize("edit, rule, path", [
    (lambda o: o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(name="main"), "pytorch-container", f"{W}.template.spec.containers"),
    (lambda o: o["spec"]["pytorchReplicaSpecs"]["Master"].pop("replicas"),
     "master-replicas", f"{M}.replicas"),
    (lambda o: o["spec"]["pytorchReplicaSpecs"].update(
        worker=o["spec"]["pytorchReplicaSpecs"].pop("Worker")),
     "replica-type", "spec.pytorchReplicaSpecs.worker"),
    (lambda o: o["metadata"].update(name="Pytorch_Simple"), "name", "metadata.name"),
    (lambda o: o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(env=[{"name": "HF_TOKEN", "value": "hf_abcdefghijklmnop"}]),
     "secret-literal", f"{W}.template.spec.containers[0].env[0].value"),
    (lambda o: o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(env=[{"name": "DB_PASSWORD", "value": "hunter2"}]),
     "secret-literal", f"{W}.template.spec.containers[0].env[0].value"),
    (lambda o: o["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="1"),
     "schema", f"{W}.replicas"),
    (lambda o: o["spec"].update(nprocPerNode=4), "schema", "spec.nprocPerNode"),
    (lambda o: o["spec"].update(nprocPerNode="four"), "nproc-per-node", "spec.nprocPerNode"),
    (lambda o: o["spec"].update(runPolicy={"backoffLimit": "3"}),
     "schema", "spec.runPolicy.backoffLimit"),
    (lambda o: o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(imagePullPolicy=["Always"]), "schema",
     f"{W}.template.spec.containers[0].imagePullPolicy"),
    (lambda o: o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].update(
        initContainers=[{"name": "wait", "image": "busybox"}]), "pod-security",
     f"{W}.template.spec.initContainers[0].securityContext.allowPrivilegeEscalation"),
    (lambda o: o["metadata"].update(labels={"team": 7}), "metadata", "metadata.labels['team']"),
    (lambda o: o["metadata"].update(bogus=1), "metadata", "metadata.bogus"),
])
def test_broken_manifests_are_rejected_with_the_rule_named(
        edit: Callable[[dict[str, Any]], object], rule: str, path: str) -> None:
    problems = broken(edit)
    assert (rule, path) in rules(problems), problems
    assert all(str(p).endswith(f"[{p.rule}]") for p in problems)


def test_elastic_rules() -> None:
    def no_worker(o: dict[str, Any]) -> None:
        o["spec"]["pytorchReplicaSpecs"] = {"Master": {
            "replicas": 1, "template": o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]}}
    assert ("elastic-worker", "spec.pytorchReplicaSpecs.Worker") in rules(broken(no_worker,
                                                                                  elastic))

    def both(o: dict[str, Any]) -> None:
        o["spec"]["nprocPerNode"] = "2"
        o["spec"]["elasticPolicy"]["nProcPerNode"] = 2
    assert ("nproc-conflict", "spec.elasticPolicy.nProcPerNode") in rules(broken(both, elastic))
    standalone = broken(lambda o: o["spec"]["elasticPolicy"].update(standalone=True), elastic)
    assert ("elastic-standalone", "spec.elasticPolicy.standalone") in rules(standalone)
    assert {p.layer for p in standalone} == {"lint"}
    # upstream has no enum for these: the API server takes them as they are
    for field, value in (("rdzvBackend", "my-store"), ("rdzvBackend", "etcd-v3")):
        assert broken(lambda o: o["spec"]["elasticPolicy"].update({field: value}),
                      elastic) == []
    assert broken(lambda o: o["spec"].update(runPolicy={"cleanPodPolicy": "Some"})) == []
    unknown = broken(lambda o: o["spec"]["elasticPolicy"].update(rdzvbackend="c10d"), elastic)
    assert any(p.rule == "schema" and "did you mean 'rdzvBackend'" in p.message
               for p in unknown)


def test_trainjob_rules() -> None:
    """Upstream has no torchrun-command rule; the torch plugin refuses its five variables (the
    path is upstream's: spec.trainer.env); secrets are torchjob's own lint."""
    obj = yaml.safe_load(TRAINJOB)
    obj["spec"]["trainer"]["command"] = ["python", "train.py"]
    assert validate(obj) == []
    obj["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "3"},
                                     {"name": "API_KEY", "value": "abc123"}]
    assert rules(validate(obj)) == {("reserved-env", "spec.trainer.env"),
                                    ("secret-literal", "spec.trainer.env[1].value")}
    obj["spec"]["runtimeRef"]["name"] = "my-own-runtime"  # unknown here: not known as torch
    assert rules(validate(obj)) == {("secret-literal", "spec.trainer.env[1].value")}
    del obj["spec"]["runtimeRef"]
    assert ("schema", "spec.runtimeRef") in rules(validate(obj))


@pytest.mark.parametrize("nproc", [0, -1])
def test_a_trainjob_with_fewer_than_one_process_per_node_is_refused(nproc: int) -> None:
    """Admitted upstream (v2.3.0 checks numProcPerNode for Flux alone), failed at the pods'
    start: refused here, naming the field and the fix; 1 and a missing value validate."""
    obj = yaml.safe_load(TRAINJOB)
    obj["spec"]["trainer"]["numProcPerNode"] = nproc
    problems = validate(obj)
    assert rules(problems) == {("nproc", "spec.trainer.numProcPerNode")}
    assert f"is {nproc}: must be >= 1" in str(problems)
    obj["spec"]["trainer"]["numProcPerNode"] = 1
    assert validate(obj) == []


def test_secret_heuristic() -> None:
    assert looks_secret("HF_TOKEN", "x") and looks_secret("AWS_SECRET_ACCESS_KEY", "x")
    assert looks_secret("ANYTHING", "ghp_0123456789abcdef0123")
    assert not looks_secret("HF_TOKEN", "") and not looks_secret("MONKEY", "banana")
    assert not looks_secret("NCCL_DEBUG", "WARN") and not looks_secret("TOKENIZERS_X", "1")


def test_schema_keywords() -> None:
    int_or_string = {"x-kubernetes-int-or-string": True}
    assert not list(check(3, int_or_string, "p")) and not list(check("50%", int_or_string, "p"))
    assert list(check([1], int_or_string, "p"))
    free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert not list(check({"any": {"thing": 1}}, free, "p"))
    strict = {"type": "object", "properties": {"a": {"type": "integer", "format": "int32"}},
              "required": ["a"]}
    assert [p for p, _ in check({"b": 1}, strict, "x")] == ["x.a", "x.b"]
    assert list(check({"a": 2**31}, strict, "x")) and list(check({"a": True}, strict, "x"))
    assert not list(check({"k": "v"}, {"type": "object", "additionalProperties":
                                       {"type": "string"}}, "m"))


def test_validate_text_and_non_manifests() -> None:
    text = yaml.safe_dump(static()) + "---\n" + yaml.safe_dump(elastic())
    assert validate_text(text) == []
    assert [p.rule for p in validate_text("a: [")] == ["yaml"]
    assert [p.rule for p in validate(["x"])] == ["manifest"]
    assert [p.rule for p in validate({"apiVersion": "v1", "kind": "Pod"})] == ["schema"]
    assert [p.rule for p in validate_text("a: 1\na: 2")] == ["yaml"]
    assert [p.rule for p in validate_text("a: .inf")] == ["yaml"]
    bad = yaml.safe_dump(static()) + "---\n" + yaml.safe_dump({**static(), "metadata": {}})
    assert rules(validate_text(bad)) == {("metadata", "[1].metadata.name")}


def test_rendered_trainjob_fits_the_newest_trainjob_crd_too() -> None:
    """k8s.schema checks the latest release (v2.3.0); master's CRD must accept it as well."""
    from torchjob.k8s.manifests import variant_spec
    from torchjob.k8s.validate.schema import SCHEMA_DIR
    from torchjob.k8s.trainjob import render_trainjob

    crd = yaml.load((SCHEMA_DIR / "trainer.kubeflow.org_trainjobs.yaml").read_text(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = render_trainjob(variant_spec("trainjob.yaml"))
    assert list(check(obj["spec"], schema["properties"]["spec"], "spec")) == []


@pytest.mark.parametrize("text", [
    "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\nspec: []",
    "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\nspec: {}",
    "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\n"
    "spec: {pytorchReplicaSpecs: {Master: null, Worker: [1]}}",
    "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\n"
    "spec: {pytorchReplicaSpecs: {Master: {replicas: 1, template: {spec: {containers: [x, null],"
    " volumes: [v], securityContext: []}}}}}",
    "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\n"
    "spec: {pytorchReplicaSpecs: {Master: {replicas: 1, template: {spec: {containers: "
    "[{name: pytorch, image: i, env: [x, {name: K_TOKEN, value: 1}], securityContext: "
    "{capabilities: []}}]}}}}, elasticPolicy: []}",
    "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: a}\n"
    "spec: {runtimeRef: {name: x}, trainer: {command: [], env: [null]}}",
    "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\n{1: 2}: x", "metadata: 3", "[]", "7",
])
def test_malformed_manifests_give_problems_not_crashes(text: str) -> None:
    problems = validate_text(text)
    assert problems and all(isinstance(p, Problem) for p in problems)


def test_vendored_crds_match_their_checksums() -> None:
    """k8s/schemas/ holds byte-for-byte upstream copies; SHA256SUMS (``sha256sum`` format) pins
    them, so an edited, missing or unlisted file fails here rather than changing validation."""
    import hashlib

    from torchjob.k8s.validate.schema import SCHEMA_DIR
    fix = ("copy the file again from upstream (SOURCES.md), then in k8s/schemas run "
           "`sha256sum $(ls | grep -vx SHA256SUMS) > SHA256SUMS`")
    listed: dict[str, str] = {}
    for line in (SCHEMA_DIR / "SHA256SUMS").read_text().splitlines():
        digest, sep, name = line.partition("  ")
        assert sep and len(digest) == 64, f"SHA256SUMS: not a sha256sum line: {line!r}"
        listed[name] = digest
    present = {p.name for p in SCHEMA_DIR.iterdir()} - {"SHA256SUMS"}
    assert present == set(listed), (
        f"unlisted: {sorted(present - set(listed))}, missing: {sorted(set(listed) - present)}; "
        + fix)
    for name, digest in listed.items():
        actual = hashlib.sha256((SCHEMA_DIR / name).read_bytes()).hexdigest()
        assert actual == digest, f"k8s/schemas/{name} changed ({actual}); {fix}"


def store_objects() -> list[dict[str, Any]]:
    from torchjob.jobs.load import loads
    from torchjob.k8s.store import render_store
    return render_store(loads("name: job\nnnodes: 1:2"))


def test_the_rendezvous_stores_deployment_and_service() -> None:
    """An elastic job's store: structural checks of what the API server requires, and Pod
    Security "restricted" for the Deployment's pod template."""
    deployment, service = store_objects()
    assert validate(deployment) == validate(service) == []
    pod = "spec.template.spec"
    broken = copy.deepcopy(deployment)
    container = broken["spec"]["template"]["spec"]["containers"][0]
    del container["securityContext"]["allowPrivilegeEscalation"]
    container["ports"][0]["containerPort"] = 70000
    broken["spec"]["template"]["metadata"]["labels"] = {"other": "x"}
    broken["spec"]["strategy"]["type"] = "Rolling"
    broken["metadata"]["name"] = "Job_rdzv"
    assert rules(validate(broken)) == {
        ("pod-security", f"{pod}.containers[0].securityContext.allowPrivilegeEscalation"),
        ("port", f"{pod}.containers[0].ports[0].containerPort"),
        ("selector", "spec.template.metadata.labels"), ("enum", "spec.strategy.type"),
        ("name", "metadata.name")}
    assert not [p for p in validate(broken, pod_security=False) if p.rule == "pod-security"]
    broken = copy.deepcopy(deployment)
    del broken["spec"]["selector"]
    broken["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    broken["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "API_TOKEN", "value": "hunter2"}]
    assert {r for r, _ in rules(validate(broken))} == {"selector", "restart-policy",
                                                       "secret-literal"}
    broken = copy.deepcopy(service)
    broken["spec"].update(type="Headless", ports=[{"port": 0, "protocol": "HTTP"}])
    broken["metadata"]["name"] = "9job"
    assert rules(validate(broken)) == {("enum", "spec.type"), ("port", "spec.ports[0].port"),
                             ("enum", "spec.ports[0].protocol"), ("name", "metadata.name")}
    del broken["spec"]["ports"]
    assert ("port", "spec.ports") in rules(validate(broken))


def test_a_multi_document_manifest_names_each_document() -> None:
    text = "---\n".join(yaml.safe_dump(obj) for obj in store_objects())
    assert validate_text(text) == []
    service = store_objects()[1]
    service["spec"]["ports"][0]["port"] = "c10d"
    text = "---\n".join(yaml.safe_dump(obj) for obj in [store_objects()[0], service])
    assert [str(p) for p in validate_text(text)] == [
        "[1].spec.ports[0].port: is 'c10d': a port number 1-65535 [port]"]


def test_yaml_is_read_as_kubectl_reads_it() -> None:
    """go-yaml v2 semantics (k8s.yaml): dates and 1:2 stay strings, y/yes/on are booleans,
    keys are strings, whole floats are integers, duplicates are refused."""
    from torchjob.k8s.yaml import YamlProblem, load_all
    [doc] = load_all("a: 2024-01-01\nb: 1:2\nc: y\nd: on\ne: 1.0\nf: 1e3\ng: 0x1F\nh: 017\n"
                     "n: 1\ni: '2024-01-01'\nj: 1.5\nk: 2024-01-01T10:00:00Z\n")
    assert doc == {"a": "2024-01-01", "b": "1:2", "c": True, "d": True, "e": 1, "f": 1000,
                   "g": 31, "h": 15, "false": 1, "i": "2024-01-01", "j": 1.5,
                   "k": "2024-01-01T10:00:00Z"}
    for text in ("a: 1\na: 2", "a: .nan", "? [1]\n: 2"):
        with pytest.raises(YamlProblem):
            load_all(text)


@pytest.mark.parametrize("scalar", ["0o_", "0x_", "0b_", "0x_1", "08", "-09", "0_7", "017",
                                    "0o17", "0b101", "1_000", "+1", "0x1F", "09.5", "1e3"])
def test_integer_like_scalars_read_as_go_yaml_reads_them(scalar: str) -> None:
    """Prefixes without digits stay strings, a leading 0 with 8 or 9 is a (float) number:
    as tests/k8s/goyaml.py's port of go-yaml v2 reads them, never a traceback."""
    from tests.k8s.goyaml import load_all as go_load_all
    from torchjob.k8s.yaml import load_all
    assert load_all(f"a: {scalar}") == go_load_all(f"a: {scalar}"), scalar
    assert validate_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n"
                         f"data: {{a: {scalar}}}\n", pod_security=False) is not None


def test_int_or_string_quantities_and_generate_name() -> None:
    quantity = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"},
                {"type": "string"}], "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"}
    for good in (2, "500m", "1Gi", "1.5", "1e3"):
        assert not list(check(good, quantity, "q")), good
    for bad in (1.5, "1GB", "1.5.0", "", "1 Gi", True):
        assert list(check(bad, quantity, "q")), bad
    from torchjob.k8s.validate.meta import effective_name
    assert effective_name({"generateName": "a" * 70}) == "a" * 58 + "bcdfg"
    assert effective_name({"name": "x", "generateName": "y-"}) == "x"
    job = static()
    job["metadata"] = {"generateName": "pytorch-"}
    assert validate(job) == []
    job["metadata"] = {"generateName": "Pytorch-"}
    assert {p.rule for p in validate(job)} == {"metadata", "name"}
    job["metadata"] = {}
    assert rules(validate(job)) == {("metadata", "metadata.name")}



def test_a_trainjobs_pods_are_its_runtimes_with_its_patches() -> None:
    """runtime_pods: the stock torch-distributed runtime's node pods break restricted; a patch
    that sets the securityContext fixes that, merged by container name."""
    from torchjob.k8s.validate.runtimes import merge
    assert merge({"containers": [{"name": "node", "image": "i"}]},
                 {"containers": [{"name": "node", "securityContext": {"a": 1}},
                                 {"name": "side"}]}) == {
        "containers": [{"name": "node", "image": "i", "securityContext": {"a": 1}},
                       {"name": "side"}]}
    job = yaml.safe_load(TRAINJOB)
    assert validate(job) == []
    stock = validate(job, runtime_pods=True)
    assert {p.layer for p in stock} == {"restricted"} and len(stock) == 4
    assert all("replicatedJobs[node]" in p.path for p in stock)

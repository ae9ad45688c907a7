"""The validator against upstream's own verdicts, and our own manifests against everything.

1. Every file of tests/k8s/corpus (upstream kubeflow/trainer examples, runtimes and the cases of
   its webhook and CEL tests, plus probes; SOURCES.md says where each comes from) gets the
   verdict its index entry states: 0 wrong. The counts per kind and source are printed
   (``pytest -s``) and are in the failure message.
2. Every example manifest in k8s/manifests/ and every rendered variant of ours passes the CRD
   schema, CEL, the webhooks and Pod Security "restricted": no problem of any layer. A
   TrainJob's pods are judged as its runtime makes them, with our runtime patches applied
   (``runtime_pods=True``).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from torchjob.k8s.validate import validate, validate_text

CORPUS = Path(__file__).resolve().parent / "corpus"
ROOT = Path(__file__).resolve().parents[2]


def entries() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for index in sorted(CORPUS.glob("index-*.yaml")):
        found += yaml.safe_load(index.read_text())
    return found


def wrong_verdict(entry: dict[str, Any]) -> str | None:
    """Why ``entry``'s file does not get the verdict its index states (None when it does)."""
    problems = validate_text((CORPUS / entry["file"]).read_text(), runtime_pods=True)
    api = [p for p in problems if p.layer == "api"]
    got = "invalid" if api else "valid"
    if got != entry["verdict"]:
        return (f"{entry['file']}: {got}, expected {entry['verdict']} ({entry['reason']}); "
                f"problems: {[str(p) for p in api]}")
    restricted = [p for p in problems if p.layer == "restricted"]
    want = entry.get("restricted")
    if want == "clean" and restricted:
        return f"{entry['file']}: restricted should be clean: {[str(p) for p in restricted]}"
    if want not in (None, "clean") and (len(restricted) != 1 or want not in restricted[0].path):
        return (f"{entry['file']}: restricted should break once at ...{want}: "
                f"{[str(p) for p in restricted]}")
    return None


def test_every_corpus_file_gets_upstreams_verdict() -> None:
    listed = entries()
    counts = collections.Counter((e["source"], kind, e["verdict"])
                                 for e in listed for kind in sorted(set(e["kinds"])))
    summary = "; ".join(f"{source} {kind} {verdict}: {n}"
                        for (source, kind, verdict), n in sorted(counts.items()))
    print(f"\ncorpus: {len(listed)} files; {summary}")
    files = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.yaml")
             if not p.name.startswith("index-")}
    assert files == {e["file"] for e in listed}, (
        f"not indexed: {sorted(files - {e['file'] for e in listed})}; "
        f"missing: {sorted({e['file'] for e in listed} - files)}")
    wrong = [why for e in listed if (why := wrong_verdict(e))]
    assert not wrong, f"{len(wrong)} wrong verdict(s) of {len(listed)} ({summary}):\n" + \
        "\n".join(wrong)
    assert {s for s, _, _ in counts} == {"v1-examples", "v2-examples", "v2-runtimes",
                                         "v1-webhook", "v2-webhook", "probes"}
    assert {k for _, k, _ in counts} >= {"PyTorchJob", "TrainJob", "TrainingRuntime",
                                         "ClusterTrainingRuntime"}


def test_every_cel_rule_of_the_vendored_crds_evaluates() -> None:
    """cel-python compiles and runs each create-time rule of every CRD in k8s/schemas and
    /work/shared/k8s-schemas (when present) on a value that satisfies it and one that does
    not; transition rules (oldSelf) are skipped on create, as by the API server."""
    from torchjob.k8s.validate.cel import holds, is_transition_rule, rule_problems
    from torchjob.k8s.validate.schema import SCHEMA_DIR
    rules: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            rules.update(v["rule"] for v in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    shared = Path("/work/shared/k8s-schemas")
    for path in [*SCHEMA_DIR.glob("*.yaml"), *(shared.glob("*.yaml") if shared.is_dir() else [])]:
        walk(yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    samples: dict[str, tuple[object, object]] = {
        "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
        "self.replicatedJobs.exists(x, has(x.dependsOn)))": (
            {"replicatedJobs": [{"name": "a", "dependsOn": []}]},
            {"startupPolicy": {"startupPolicyOrder": "InOrder"},
             "replicatedJobs": [{"dependsOn": []}]}),
        "!self.exists(c, c == 'node')": (["a"], ["node"]),
        "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)]"
        ".filter(x, x).size() <= 1": ({"torch": {}}, {"torch": {}, "mpi": {}}),
        "has(self.lastUpdatedTime)": ({"lastUpdatedTime": "x"}, {}),
        "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": ("hf://x/y", "s3://"),
        "self >= 1": (1, 0),
        "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']": (
            "kueue.x-k8s.io/multikueue", "other"),
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": (
            {"metadata": {"name": "a-1"}}, {"metadata": {"name": "a.1"}}),
        "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)": (
            {"templates": [{"metadata": {}}]}, {"templates": [{"metadata": {"namespace": "x"}}]}),
        "size(self.metadata.name) <= 63": ({"metadata": {"name": "a"}},
                                           {"metadata": {"name": "a" * 64}}),
    }
    create_rules = {r for r in rules if not is_transition_rule(r)}
    assert create_rules == set(samples), "a CRD has a rule this test does not exercise"
    for rule, (good, bad) in samples.items():
        assert holds(rule, good) == (True, ""), rule
        assert holds(rule, bad)[0] is False, rule
    assert "self == oldSelf" in rules
    assert not list(rule_problems(1, [{"rule": "self == oldSelf"}], "p"))


def test_copied_upstream_files_are_byte_for_byte() -> None:
    """A file copied from upstream has the git blob its index entry names (so an edit shows)."""
    import hashlib
    for e in entries():
        if "blob" in e:
            data = (CORPUS / e["file"]).read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            assert blob == e["blob"], f"{e['file']} differs from {e['repo']} {e['ref']}:{e['path']}"


def test_the_corpus_covers_every_pod_security_control() -> None:
    """Each restricted control broken once in the probes (the messages name the control)."""
    controls = set()
    for e in entries():
        if e.get("restricted") not in (None, "clean"):
            for p in validate_text((CORPUS / e["file"]).read_text()):
                if p.layer == "restricted":
                    controls.add(p.message.split(")")[0].lstrip("("))
    assert controls == {"HostProcess", "Host Namespaces", "Privileged", "Capabilities",
                        "Volume Types", "Host Ports", "AppArmor", "SELinux", "/proc Mount Type",
                        "Seccomp", "Sysctls", "Privilege Escalation", "Running as Non-root",
                        "Running as Non-root user"}


def check_everything(text: str) -> None:
    problems = validate_text(text) + validate_text(text, runtime_pods=True)
    assert problems == [], "\n".join(str(p) for p in problems)


def _variants() -> list[tuple[str, list[str], str]]:
    """(example, --set overrides, target) for every kind of job we render: the variants of
    k8s/manifests plus Kueue, Volcano, GPU and PVC on each target that takes them."""
    from torchjob.k8s.manifests import VARIANTS, pytorchjob
    shipped = [(example, overrides, "pytorchjob" if renderer is pytorchjob else "trainjob")
               for example, overrides, renderer in VARIANTS.values()]
    return shipped + [
        ("default", ["k8s.queue=team-a", "resources.cpu=2", "resources.memory=4Gi"],
         "pytorchjob"),
        ("default", ["k8s.volcano_queue=research"], "pytorchjob"),
        ("elastic", ["k8s.pvc=runs", "resources.gpus=2"], "pytorchjob"),
        ("default", ["nnodes=2", "resources.gpus=2", "k8s.queue=team-a", "resources.cpu=2",
                     "resources.memory=4Gi", "k8s.pvc=runs"], "trainjob"),
        ("default", ["nnodes=2", "k8s.queue=team-a", "resources.cpu=2", "resources.memory=4Gi",
                     "k8s.pvc=runs", "k8s.topology={level: rack, mode: preferred}"],
         "trainjob"),
        ("default", ["k8s.volcano_queue=research", "resources.gpus=2"], "trainjob"),
        ("default", ["nnodes=2", "k8s.pvc=runs", "k8s.priority_class=high"], "trainjob"),
    ]


VARIANT_IDS = ["-".join([target, example, *overrides]) for example, overrides, target
               in _variants()]
MANIFESTS = sorted(p.name for p in (ROOT / "k8s" / "manifests").glob("*.yaml"))


def _rendered(example: str, overrides: list[str], target: str) -> list[dict[str, Any]]:
    """The objects the public render entry makes (which validates them too, naming each
    broken rule)."""
    import torchjob.jobs.examples
    from torchjob.jobs.load import loads
    from torchjob.k8s import render
    path = Path(torchjob.jobs.examples.__file__).resolve().parent / f"{example}.yaml"
    spec = loads(path.read_text(), overrides, source=str(path))
    return render.render_objects(spec, target)


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_shipped_example_manifests_pass_everything(name: str) -> None:
    assert MANIFESTS
    check_everything((ROOT / "k8s" / "manifests" / name).read_text())


@pytest.mark.parametrize("variant", _variants(), ids=VARIANT_IDS)
def test_every_rendered_variant_passes_schema_cel_webhooks_and_restricted(
        variant: tuple[str, list[str], str]) -> None:
    from torchjob.k8s.pod import manifests_text
    check_everything(manifests_text(_rendered(*variant)))


def test_a_render_that_breaks_a_rule_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The render entry validates what it makes: a renderer bug is a UserError, not output."""
    from torchjob.jobs.values import UserError
    from torchjob.k8s import render
    render_fn: Callable[..., Any] = render.TARGETS["pytorchjob"]

    def hostile(spec: Any) -> dict[str, Any]:
        obj = render_fn(spec)
        for rs in obj["spec"]["pytorchReplicaSpecs"].values():
            rs["template"]["spec"]["hostNetwork"] = True
        return dict(obj)
    monkeypatch.setitem(render.TARGETS, "pytorchjob", hostile)
    import torchjob.jobs.examples
    from torchjob.jobs.load import loads
    path = Path(torchjob.jobs.examples.__file__).resolve().parent / "default.yaml"
    with pytest.raises(UserError, match="hostNetwork"):
        render.render_objects(loads(path.read_text(), [], source=str(path)))


def test_hostile_variations_of_the_corpus_give_problems_not_crashes() -> None:
    """Every corpus document with fields replaced by values of the wrong shape (seeded, so a
    failure repeats): validation names problems and never raises."""
    import copy
    import random

    rng = random.Random(14)
    junk: list[object] = [None, 1, "x", [], {}, [1], {"a": None}, True, 1.5, [{}], [None], -1,
                          "", {"name": []}, [[]]]

    def paths(node: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        found = [path]
        items = node.items() if isinstance(node, dict) else enumerate(node) \
            if isinstance(node, list) else []
        for key, value in items:
            found += paths(value, (*path, key))
        return found
    docs = [d for e in entries() if not e["file"].startswith("v2-webhook/command-")
            for d in yaml.safe_load_all((CORPUS / e["file"]).read_text()) if d]
    for doc in docs:
        for _ in range(2):
            obj = copy.deepcopy(doc)
            for _ in range(rng.choice([1, 2, 3])):
                path = rng.choice(paths(obj)[1:])
                parent: Any = obj
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = copy.deepcopy(rng.choice(junk))
            for problem in validate(obj, runtime_pods=True):
                assert problem.rule and isinstance(problem.message, str)

"""`torchjob render --to k8s[:trainjob]` and `torchjob validate`, as a user runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.procs import torchjob

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("to, job", [("k8s", "default"), ("k8s", "elastic"),
                                     ("k8s:trainjob", "default")])
def test_rendered_manifests_validate(to: str, job: str) -> None:
    rendered = torchjob("render", "--to", to, f"jobs/examples/{job}.yaml")
    assert rendered.returncode == 0, rendered.stderr
    checked = torchjob("validate", "-", input=rendered.stdout)
    assert checked.returncode == 0 and checked.stdout == "-: valid\n", checked.stderr


def test_trainjob_of_an_elastic_spec_is_refused() -> None:
    proc = torchjob("render", "--to", "k8s:trainjob", "jobs/examples/elastic.yaml")
    assert proc.returncode == 2 and "no elastic training" in proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_a_multi_node_trainjob_without_a_pvc_stops_before_anything_is_printed() -> None:
    proc = torchjob("render", "--to", "k8s:trainjob", "jobs/examples/default.yaml",
                    "--set", "nnodes=2")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("torchjob: ") and "k8s.pvc" in proc.stderr
    assert "ReadWriteMany" in proc.stderr and "Traceback" not in proc.stderr
    ok = torchjob("render", "--to", "k8s:trainjob", "jobs/examples/default.yaml", "--set",
                  "nnodes=2", "--set", "k8s.pvc=runs")
    assert ok.returncode == 0 and "claimName: runs" in ok.stdout, ok.stderr


def test_validate_names_each_broken_rule() -> None:
    broken = ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: Bad_Name}\n"
              "spec:\n  pytorchReplicaSpecs:\n    master: {replicas: 2}\n")
    proc = torchjob("validate", "-", input=broken)
    assert proc.returncode == 2
    assert "metadata.name" in proc.stderr and "[name]" in proc.stderr
    assert "[replica-type]" in proc.stderr


def test_validate_the_shipped_manifests() -> None:
    files = sorted(str(p) for p in (ROOT / "k8s" / "manifests").glob("*.yaml"))
    assert len(files) >= 5
    proc = torchjob("validate", *files)
    assert proc.returncode == 0, proc.stderr


def test_validate_a_missing_file_exits_2() -> None:
    proc = torchjob("validate", "nope.yaml")
    assert proc.returncode == 2 and "nope.yaml: cannot read it" in proc.stderr

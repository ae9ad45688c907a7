"""`torchx run -s kubernetes --dryrun` of the component prints the expected request, whole.

The scheduler's request is compared with a golden file after replacing the random app id
(regenerate with TORCHJOB_REGEN_GOLDEN=1).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden import assert_golden

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "torchx_kubernetes_2x2.yaml"


def test_kubernetes_dryrun_request_is_the_golden_one(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchx"), "run", "-s", "kubernetes", "--dryrun",
         "--workspace", "", "-cfg", "queue=default,namespace=default",
         f"{ROOT}/jobs/backends/torchx/components.py:train", "-j", "2x2", "--name", "digits", "--gpu", "2",
         "--", "--epochs", "3"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    request = proc.stdout.split("=== SCHEDULER REQUEST ===", 1)[1].strip() + "\n"
    app_id = re.search(r"^  name: (digits-\w+)$", request, re.MULTILINE)
    assert app_id, request
    request = request.replace(app_id.group(1), "APP_ID")
    assert_golden(request, GOLDEN)
    assert "nvidia.com/gpu: '2'" in request and "${TORCHX_RANK0_HOST:=localhost}:29400" in request


def test_torchjobs_kubernetes_requests_give_every_pod_the_stop_grace(tmp_path: Path) -> None:
    """TorchX's Role has no grace period (pods would get Kubernetes' 30 s): the backend sets the
    job's stop_grace on every pod of the request it renders and submits."""
    from tests.procs import env_for_tests, torchjob
    (tmp_path / ".torchxconfig").write_text("[kubernetes]\nqueue = default\n"
                                            "[kubernetes_mcad]\nnamespace = default\n")
    for scheduler in ("kubernetes", "kubernetes_mcad"):
        out = torchjob("render", "--to", f"torchx:{scheduler}",
                       f"{ROOT}/jobs/examples/default.yaml", "--set", "nnodes=3",
                       "--set", "stop_grace=77", cwd=tmp_path, env=env_for_tests())
        assert out.returncode == 0, out.stderr[-3000:]
        graces = re.findall(r"terminationGracePeriodSeconds: (\d+)", out.stdout)
        assert graces == ["77"] * 3, (scheduler, out.stdout)  # a pod per node


def test_local_docker_requests_mount_the_run_dir_and_carry_the_stop_grace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchx:local_docker's request: every container mounts the run directory from where
    torchjob runs (at the image's working directory), carries the job's stop_grace for the
    cancel, and runs as the invoking user where that is not root (under a rootless engine the
    container's root, which is that user on the host), as the docker backend's containers do.
    (Rendered in this process; tests/containers/test_nonroot.py runs them as a user.)"""
    from torchjob.jobs import api
    from torchjob.jobs import backend as registry
    from torchjob.jobs.backends.torchx import needs
    from torchjob.jobs.invocation import plan
    monkeypatch.chdir(tmp_path)
    backend = registry.get("torchx:local_docker")
    spec = api.load(ROOT / "jobs/examples/default.yaml", ["nnodes=2", "stop_grace=77"])
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    monkeypatch.setattr(os, "getgid", lambda: 567)
    for rootless, user in ((False, "1234:567"), (True, "0:0")):
        monkeypatch.setattr(needs, "docker_rootless", lambda: rootless)
        containers = plan(backend, spec, fresh=False, source=None)[0].data.request.containers
        assert len(containers) == 2
        for container in containers:
            mounts = [(m["Source"], m["Target"]) for m in container.kwargs["mounts"]]
            assert mounts == [(f"{tmp_path}/runs", "/workspace/runs")]
            assert container.kwargs["labels"]["io.torchjob.stop-grace"] == "77"
            assert container.kwargs["user"] == user and "userns_mode" not in container.kwargs
    monkeypatch.setattr(os, "getuid", lambda: 0)
    as_root = plan(backend, spec, fresh=False, source=None)[0].data.request.containers[0].kwargs
    assert "user" not in as_root


def test_local_requests_carry_the_runs_grace(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait between a cancel's stop signal and the kill, in local_cwd's request (TorchX's
    own is 10 s) and on local_docker's containers: the spec's stop_grace, or run --grace."""
    from torchjob.jobs import api
    from torchjob.jobs import backend as registry
    from torchjob.jobs.invocation import plan
    monkeypatch.chdir(tmp_path)
    spec = api.load(ROOT / "jobs/examples/default.yaml", ["stop_grace=77"])
    for grace, expected in ((None, 77), (90.5, 90.5)):
        cwd = plan(registry.get("torchx:local_cwd"), spec, fresh=False, source=None,
                   grace=grace)[0]
        assert cwd.data.request.stop_grace == expected
        assert f"'stop_grace': {expected}" in cwd.text
        docker = plan(registry.get("torchx:local_docker"), spec, fresh=False, source=None,
                      grace=grace)[0].data.request.containers[0].kwargs
        assert docker["labels"]["io.torchjob.stop-grace"] == str(math.ceil(expected))


def test_a_relative_mount_source_starts_where_torchjob_runs_or_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``./data`` binds the working directory's data/ where the nodes see this machine
    (local_docker, as --to docker; the AppDef of --to torchx), and is refused where they do
    not (kubernetes); a bare name stays a volume. TorchX itself would make ``./data`` a volume
    of that name."""
    from torchjob.jobs import api
    from torchjob.jobs import backend as registry
    from torchjob.jobs.invocation import plan
    from torchjob.jobs.values import SpecError
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".torchxconfig").write_text("[kubernetes]\nqueue = default\n")
    spec = api.load(ROOT / "jobs/examples/default.yaml", [
        "mounts=[{source: ./data/../data, target: /data, read_only: true}, "
        "{source: cache, target: /cache}]"])
    (docker,) = plan(registry.get("torchx:local_docker"), spec, fresh=False, source=None)
    kwargs = docker.data.request.containers[0].kwargs
    assert [(m["Type"], m["Source"], m["Target"], m["ReadOnly"]) for m in kwargs["mounts"]][:2] \
        == [("bind", f"{tmp_path}/data", "/data", True), ("volume", "cache", "/cache", False)]
    (bare,) = plan(registry.get("torchx"), spec, fresh=False, source=None)
    assert bare.data.roles[0].mounts[0].src_path == f"{tmp_path}/data"
    with pytest.raises(SpecError, match=r"mounts\[0\]\.source: './data/../data' is a path on "
                       "this machine .* give the directory's path on the nodes"):
        plan(registry.get("torchx:kubernetes"), spec, fresh=False, source=None)

"""TorchX's local_docker scheduler runs this project's component through podman's
Docker-compatible API (no Docker engine runs here; podman serves the same API)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from torchx.specs import AppState

from tests.procs import ROOT, torchjob, wait_for, with_sitecustomize

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def start_docker_api() -> subprocess.CompletedProcess[str]:
    """``scripts/container-setup docker-api``, which must succeed."""
    api = subprocess.run(["bash", str(ROOT / "scripts" / "container-setup"), "docker-api"],
                         capture_output=True, text=True, timeout=120)
    assert api.returncode == 0, api.stderr
    return api


QUIET_TIMEOUT_S = 20  # the Docker client's read timeout in the quiet job's test

# the socket scripts/container-setup docker-api serves (its SOCKET)
DOCKER_API = "unix:///run/podman/podman.sock"


def service_pids(docker_host: str = "") -> list[int]:
    """The podman API services (answering on ``docker_host``, when given)."""
    found = subprocess.run(["pgrep", "-f", f"^podman system service .*{docker_host}"],
                           capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


@pytest.fixture(scope="module")
def docker_host(container_image: str) -> Iterator[str]:
    """podman's Docker API socket, started by scripts/container-setup; its DOCKER_HOST. The
    service these tests started is stopped after them; a service that ran before them runs
    after them too. TorchX's network (``torchx``) stays, as TorchX leaves it: the conformance
    matrix's local_docker cells may be using it (``podman network rm -f`` stops every
    container on a network)."""
    before = service_pids(DOCKER_API)  # this socket's: the conformance matrix runs its own
    api = start_docker_api()
    host = [line for line in api.stdout.splitlines() if line.startswith("DOCKER_HOST=")][-1]
    host = host.split("=", 1)[1]
    yield host
    if before:
        start_docker_api()  # a test replaced the service that was running
        return
    for pid in service_pids(host):
        os.kill(pid, 15)
    wait_for(lambda: not service_pids(host), 30, "the podman API service the tests started "
             "to exit")


def remove_app_containers(output: str) -> None:
    """TorchX's local_docker keeps an app's exited containers (for ``torchx log``); remove
    those of the app whose handle ``output`` names, so that no test leaves one behind."""
    for app_id in set(re.findall(r"local_docker://[^/\s]*/([\w-]+)", output)):
        ids = subprocess.run(["podman", "ps", "-aq", "--filter",
                              f"label=torchx.pytorch.org/app-id={app_id}"],
                             capture_output=True, text=True, check=False).stdout.split()
        if ids:
            subprocess.run(["podman", "rm", "-f", *ids], capture_output=True, check=False)


def test_podman_stopped_state_reads_as_the_exit_code(container_image: str,
                                                     docker_host: str) -> None:
    """podman reports ``stopped`` between a container's exit and its clean-up; TorchX's own
    DockerScheduler raises KeyError on it. Catch a real container in that state (polling
    as torchx does, only faster) and read it through torchjob's local_docker scheduler."""
    import docker

    from torchjob.jobs.backends.torchx.podman import DockerOrPodmanScheduler

    client = docker.DockerClient(base_url=docker_host)
    scheduler = DockerOrPodmanScheduler(session_name="test")
    seen: dict[str, AppState] = {}
    for code in (0, 3, 0, 3, 0, 3):
        container = client.containers.run(container_image, ["python", "-c",
                                          f"raise SystemExit({code})"], detach=True)
        try:
            deadline = time.monotonic() + 60
            while container.status != "exited" and time.monotonic() < deadline:
                container.reload()
                if container.status == "stopped":
                    seen[f"stopped {code}"] = scheduler._get_app_state(container)
            seen[f"exited {code}"] = scheduler._get_app_state(container)
        finally:
            container.remove(force=True)
        if len(seen) == 4:
            break
    assert seen == {"stopped 0": AppState.SUCCEEDED, "stopped 3": AppState.FAILED,
                    "exited 0": AppState.SUCCEEDED, "exited 3": AppState.FAILED}


def test_torchx_local_docker_through_podman(container_image: str, docker_host: str,
                                            tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": docker_host,
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o777)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "torchx"), "run", "-s", "local_docker",
         "--workspace", "", f"{ROOT}/jobs/backends/torchx/components.py:train", "-j", "1x2", "--name", "txd",
         "--image", container_image, "--mounts", f"type=bind,src={runs},dst=/workspace/runs",
         "--", "--epochs", "4"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600)
    remove_app_containers(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "SUCCEEDED" in proc.stdout + proc.stderr
    summary = json.loads((runs / "txd" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["accuracy"] >= 0.95


def test_torchjob_run_builds_the_kits_image_it_lacks(container_image: str, docker_host: str,
                                                     tmp_path: Path) -> None:
    """``torchjob run --to torchx:local_docker`` with the kit's image missing here builds it,
    as ``--to docker`` does, for the built-in trainer and as the base of a script's workspace
    image: TorchX itself would try to pull it from a registry and fail. The script reads a
    directory mounted from a relative source, as --to docker reads one (TorchX would make
    ``./data`` a volume of that name)."""
    image = f"localhost/torchjob:tx-missing-{os.getpid()}"
    env = {**os.environ, "DOCKER_HOST": docker_host, "OMP_NUM_THREADS": "1"}
    (tmp_path / "train.py").write_text("import os\nprint('trained as rank', os.environ['RANK'], "
                                       "'on', open('/data/x.txt').read())\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("mounted data")
    runs: list[tuple[str, ...]] = [
        ("--set", "trainer.args.epochs=1", f"{ROOT}/jobs/examples/default.yaml"),
        ("--set", "mounts=[{source: ./data, target: /data, read_only: true}]", "train.py")]
    out = ""
    try:
        for argv in runs:
            subprocess.run(["podman", "rmi", "-f", image], capture_output=True, check=False)
            proc = torchjob("run", "--to", "torchx:local_docker", "--set", f"image={image}",
                            *argv, cwd=tmp_path, env=env, timeout=600)
            out = proc.stdout + proc.stderr
            remove_app_containers(out)
            assert proc.returncode == 0, out[-3000:]
            assert f"torchjob: image {image} is missing; building it" in out, out[-3000:]
        assert "trained as rank 0 on mounted data" in out, out[-3000:]
        assert "building localhost/torchjob-workspace:" in out
    finally:
        subprocess.run(["podman", "rmi", "-f", image, *re.findall(
            r"building (localhost/torchjob-workspace:\S+):", out)], capture_output=True,
            check=False)


# Ctrl-C of ``torchjob run --to torchx:local_docker`` (every worker checkpoints, exit 143, the
# same command resumes, bit for bit): the conformance matrix's "stop and resume" cell.


def test_a_job_quiet_for_longer_than_the_clients_timeout_is_followed_to_its_end(
        container_image: str, docker_host: str, tmp_path: Path) -> None:
    """A job whose containers print nothing for longer than the Docker client's read timeout
    (podman's API answers a log request only once there is a line): its lines and its exit
    code still reach ``torchjob run``. The log request used to end in a ReadTimeout there, in
    a thread's traceback, and the job's lines were lost. The client's default timeout (60 s)
    is made QUIET_TIMEOUT_S here (sitecustomize), so that the script is quiet for 25 s, not
    70: every other request of the client still has that long."""
    code = ("try:\n    import docker.client\nexcept ImportError:\n    pass\nelse:\n"
            f"    docker.client.DEFAULT_TIMEOUT_SECONDS = {QUIET_TIMEOUT_S}\n")
    env = {**os.environ, "DOCKER_HOST": docker_host, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": with_sitecustomize(tmp_path, code)}
    work = tmp_path / "job"  # the workspace image's directory: without the hook
    work.mkdir()
    (work / "quiet.py").write_text(
        f"import time\ntime.sleep({QUIET_TIMEOUT_S + 5})\nprint('spoke at last', flush=True)\n"
        "raise SystemExit(3)\n")
    proc = torchjob("run", "--to", "torchx:local_docker", "--nproc-per-node", "1", "quiet.py",
                    cwd=work, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    remove_app_containers(out)
    subprocess.run(["podman", "rmi", "-f", *re.findall(
        r"building (localhost/torchjob-workspace:\S+):", out)], capture_output=True,
        check=False)
    assert "spoke at last" in out and "Traceback" not in out, out[-3000:]
    assert proc.returncode == 1, out[-3000:]


def test_docker_api_replaces_a_service_whose_directory_is_gone(container_image: str,
                                                               docker_host: str,
                                                               tmp_path: Path) -> None:
    """A podman service started from a checkout that was later removed still answers, but
    cannot start a container ("write child: broken pipe"); ``container-setup docker-api``
    replaces it with one started from /. (Last in this file: it replaces the shared one.)"""
    import docker

    def answers() -> bool:
        return subprocess.run(["podman", "--url", docker_host, "version"],
                              capture_output=True, check=False).returncode == 0

    for pid in service_pids(docker_host):
        os.kill(pid, 15)
    wait_for(lambda: not service_pids(docker_host), 10, "the running service to exit")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    subprocess.Popen(["podman", "system", "service", "--time=0", docker_host], cwd=checkout,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(answers, 10, "a service started from the checkout")
    checkout.rmdir()
    stale = service_pids(docker_host)
    client = docker.DockerClient(base_url=docker_host)
    name = f"stale-service-{os.getpid()}"
    with pytest.raises(docker.errors.APIError, match="broken pipe"):
        client.containers.run(container_image, ["true"], name=name)

    assert "its working directory is gone" in start_docker_api().stderr
    assert not set(stale) & set(service_pids(docker_host))
    client.containers.get(name).remove(force=True)  # created, never started
    assert client.containers.run(container_image, ["python", "-c", "print('up')"],
                                 remove=True) == b"up\n"

"""The image built from the Dockerfile runs the trainer as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``podman ARGS``; output captured as text, never raises on a non-zero exit."""
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def writable_dir(path: Path) -> Path:
    """A bind-mount source the image's user (uid 1000, not the host's root) can write to."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


def test_image_runs_as_non_root_user(container_image: str) -> None:
    proc = podman("run", "--rm", container_image, "id", "-u")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1000"


def test_plain_run_trains_the_default_job_in_one_process(container_image: str,
                                                         tmp_path: Path) -> None:
    runs = writable_dir(tmp_path / "runs")
    proc = podman("run", "--rm", "-v", f"{runs}:/workspace/runs", container_image,
                  timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary_path = runs / "default" / "summary.json"
    summary = json.loads(summary_path.read_text())
    assert summary["world_size"] == 1
    assert summary["accuracy"] >= 0.95, summary
    assert os.stat(summary_path).st_uid == 1000  # written by the image's user, not root


def test_agent_trains_the_default_job_with_two_processes(container_image: str,
                                                         tmp_path: Path) -> None:
    runs = writable_dir(tmp_path / "runs")
    proc = podman("run", "--rm", "--shm-size", "256m", "-v", f"{runs}:/workspace/runs",
                  container_image, "python", "-m", "torchjob.trainer.agent", "--standalone",
                  "--nproc-per-node", "2", "-m", "torchjob.trainer", "--epochs", "12",
                  "--run-dir", "/workspace/runs/x", timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((runs / "x" / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["accuracy"] >= 0.95, summary
    assert "[rank 0/2]" in proc.stderr and "[rank 1/2]" in proc.stderr


def test_agent_reads_pet_variables_as_in_a_pytorchjob_pod(container_image: str,
                                                          tmp_path: Path) -> None:
    """The pod's command carries no topology; the operator's PET_* variables supply it."""
    runs = writable_dir(tmp_path / "runs")
    proc = podman("run", "--rm", "-v", f"{runs}:/workspace/runs",
                  "-e", "PET_STANDALONE=1", "-e", "PET_NPROC_PER_NODE=2", container_image,
                  "python", "-m", "torchjob.trainer.agent", "-m", "torchjob.trainer",
                  "--epochs", "1",
                  "--run-dir", "/workspace/runs/pet", timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((runs / "pet" / "summary.json").read_text())["world_size"] == 2


def test_shm_size_reaches_the_container(container_image: str) -> None:
    proc = podman("run", "--rm", "--shm-size", "256m", container_image,
                  "df", "--output=size", "-k", "/dev/shm")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == str(256 * 1024)


def labelled(base: str, tag: str, label: str, folder: Path) -> str:
    """``tag``: ``base`` with the trainer label set to ``label``; its image id."""
    (folder / "Containerfile").write_text(
        f"FROM {base}\nLABEL io.torchjob.trainer={json.dumps(label)}\n")
    built = podman("build", "-t", tag, str(folder), timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    return podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def test_an_image_of_another_torchjob_is_rebuilt_and_one_built_by_hand_kept(
        container_image: str, tmp_path: Path) -> None:
    """The image carries its trainer package's digest (scripts/container-setup computes the
    one torchjob does). ``torchjob run --to docker`` rebuilds an image whose digest is
    another's (an upgrade: its agent would refuse the options the launcher now gives it, or
    run as the old one did) and uses an image without the label as it is."""
    from torchjob.jobs.images import ensure_image, trainer_digest, trainer_label
    engine = "podman"
    digest = trainer_digest()
    assert trainer_label(engine, container_image) == digest
    stale, by_hand = "localhost/torchjob-test-stale:latest", "localhost/torchjob-test-own:latest"
    try:
        labelled(container_image, stale, "0123456789abcdef", tmp_path)
        own = labelled(container_image, by_hand, "", tmp_path)
        log = tmp_path / "err.txt"
        with open(log, "w") as err:
            ensure_image(engine, by_hand, err)
            ensure_image(engine, stale, err)
        said = log.read_text()
        assert f"image {by_hand}" not in said, said
        assert podman("image", "inspect", "--format", "{{.Id}}", by_hand).stdout.strip() == own
        assert f"torchjob: image {stale} holds another torchjob's trainer (0123456789abcdef; " \
            f"this one's is {digest}); building it" in said, said
        assert trainer_label(engine, stale) == digest
        ran = podman("run", "--rm", stale, "python", "-c", "import torchjob.trainer.gpus")
        assert ran.returncode == 0, ran.stderr[-2000:]
    finally:
        podman("rmi", "-f", stale, by_hand)

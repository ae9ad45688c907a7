"""The pod contract for real: one podman container per replica, named and resolvable as the
operator names its pods, with the pod's image, command and env plus exactly the env the
PyTorchJob operator injects (shared/K8S-CONTRACT.md), the run directory a PVC (a host
directory bind-mounted into every pod, standing in for a ReadWriteMany claim). Every pod, as
the operator mutates it, passes Pod Security "restricted" (the emulator refuses it otherwise).
Training must complete with the right world size, and the job succeed as the operator judges
it. A job of several pods has its rendezvous store (its Deployment's pod, reachable by its
Service's name); losing a pod (a node), or the store's pod, does not end the job: a fixed-size
job killed mid-run and one whose store was killed resume from the shared checkpoint and end
bitwise where an uninterrupted run ends, and an elastic job goes on without worker-0. (The
operator itself cannot run here: tests/k8s/pods.py emulates what it does with the pods; the
conformance matrix's pod column runs on it too.)"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import time
from pathlib import Path

import pytest

from torchjob.jobs.load import load
from torchjob.k8s.render import render_objects
from torchjob.jobs.spec import JobSpec
from tests.k8s.pods import Pod, PodJob, leftovers, run
from tests.procs import ROOT, assert_bitwise_equal, final_params, last_step, wait_for
from torchjob.trainer.contract import EXIT_STORE_LOST

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def test_an_elastic_job_trains_in_its_pods_with_the_operators_env(container_image: str,
                                                                  tmp_path: Path) -> None:
    name = f"pc-{secrets.token_hex(2)}"
    spec = load(ROOT / "jobs" / "examples" / "elastic.yaml",
                # the first round waits for both pods (podman may start them seconds apart)
                ["rdzv.last_call_timeout=20", f"name={name}", "trainer.args.epochs=2",
                 "image=" + container_image, "k8s.pvc=runs", "k8s.pvc_mount_path=/workspace"])
    code, pods = run(render_objects(spec, "pytorchjob"), {"runs": tmp_path})
    logs = "\n".join(pods.logs_of(pod)[-3000:] for pod in pods.pods)
    assert [pod.name for pod in pods.pods] == [f"{name}-worker-0", f"{name}-worker-1"], logs
    assert code == 0 and pods.why == "Succeeded", logs
    assert not leftovers(pods.token)
    summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["accuracy"] >= 0.9, summary


# A fixed-size job of 2 pods x 2 processes, short, checkpointing often: the runs below lose a
# pod or the store mid-run and must end where the uninterrupted one ends, bit for bit.
FIXED = ["nnodes=2", "trainer.args.epochs=2", "trainer.args.batch_size=8",
         "trainer.args.checkpoint_every=10", "trainer.args.log_every=1",
         "collective_timeout=30", "hang_timeout=0", "k8s.pvc=runs",
         "k8s.pvc_mount_path=/workspace"]


def fixed_job(image: str, *sets: str) -> JobSpec:
    return load(ROOT / "jobs" / "examples" / "default.yaml",
                [*FIXED, f"name=pf-{secrets.token_hex(2)}", "image=" + image, *sets])


def checkpointed(run_dir: Path) -> bool:
    """A checkpoint is finished on the claim (its manifest is written last)."""
    return any((run_dir / "checkpoints").glob("step_*/manifest.json"))


@pytest.fixture(scope="module")
def uninterrupted(container_image: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, object]:
    """The fixed-size job run to the end untouched: Worker-only pods (no Master, so no operator
    init container), the operator's env, world size 4; its final parameters."""
    claim = tmp_path_factory.mktemp("uninterrupted")
    spec = fixed_job(container_image)
    code, pods = run(render_objects(spec, "pytorchjob"), {"runs": claim})
    logs = "\n".join(pods.logs_of(pod)[-3000:] for pod in pods.pods)
    assert [pod.name for pod in pods.pods] == [f"{spec.name}-worker-{i}" for i in (0, 1)], logs
    assert code == 0 and pods.why == "Succeeded", logs
    assert not leftovers(pods.token)
    summary = json.loads((claim / "runs" / spec.name / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["accuracy"] >= 0.9, summary
    return dict(final_params(claim / "runs" / spec.name / "checkpoints"))


def interrupted(image: str, claim: Path, victim: str, lose: str) -> tuple[int, PodJob, str,
                                                                           Path]:
    """The fixed-size job with ``victim`` (``worker-0`` or ``store``) killed (SIGKILL: its
    node gone) once a checkpoint is on the claim and step 25 is reached; (exit code, the job,
    the pods' lines, the run directory). ``lose`` is what the deadline's message calls it."""
    spec = fixed_job(image)
    run_dir = claim / "runs" / spec.name
    out = io.StringIO()
    killed: list[str] = []

    def chaos(pods: PodJob) -> None:
        wait_for(lambda: (checkpointed(run_dir) and last_step(run_dir) >= 25)
                 or pods.outcome is not None, 300,
                 f"a checkpoint and step 25 before {lose} (seen: step {last_step(run_dir)}, "
                 f"checkpoints {sorted(p.name for p in (run_dir / 'checkpoints').glob('*'))})")
        if pods.outcome is None:
            pod: Pod = pods.stores[0] if victim == "store" else next(
                p for p in pods.pods if p.name == f"{spec.name}-{victim}")
            pods.kill(pod)
            killed.append(pod.name)

    code, pods = run(render_objects(spec, "pytorchjob"), {"runs": claim}, out=out,
                     during=chaos)
    logs = out.getvalue()
    assert killed, f"{lose} did not happen mid-run (exit {code}, {pods.why})\n{logs[-6000:]}"
    return code, pods, logs, run_dir


def test_a_pod_killed_mid_run_comes_back_and_resumes_from_the_shared_claim(
        container_image: str, tmp_path: Path, uninterrupted: dict[str, object]) -> None:
    """worker-0's pod killed (exit 137): the ExitCode policy creates it again, with an empty
    disk of its own; it resumes with worker-1 from the checkpoint on the claim, and the job
    ends bitwise where the uninterrupted run ended."""
    code, pods, logs, run_dir = interrupted(container_image, tmp_path, "worker-0",
                                            "killing worker-0")
    assert code == 0 and pods.why == "Succeeded", logs[-6000:]
    assert [p.incarnation for p in pods.pods] == [1, 0], logs[-6000:]
    assert "resumed from step_" in logs, logs[-6000:]
    assert_bitwise_equal(final_params(run_dir / "checkpoints"), uninterrupted)  # type: ignore
    assert not leftovers(pods.token)


def test_the_store_pod_killed_mid_run_the_job_resumes_and_finishes(
        container_image: str, tmp_path: Path, uninterrupted: dict[str, object]) -> None:
    """The rendezvous store's pod killed: its Deployment creates it again; the agents, which
    cannot reconnect to a new store, end with EXIT_STORE_LOST (>= 128), the ExitCode policy
    creates their pods again, they meet at the new store and resume from the claim, and the
    job ends bitwise where the uninterrupted run ended."""
    code, pods, logs, run_dir = interrupted(container_image, tmp_path, "store",
                                            "killing the store")
    assert code == 0 and pods.why == "Succeeded", logs[-6000:]
    assert pods.stores[0].incarnation == 1, logs[-6000:]  # created again by its Deployment
    lost = f"the rendezvous store was lost"
    assert lost in logs and f"exit {EXIT_STORE_LOST})" in logs, logs[-6000:]
    assert all(p.incarnation >= 1 for p in pods.pods), logs[-6000:]  # ExitCode: recreated
    assert "resumed from step_" in logs, logs[-6000:]
    assert_bitwise_equal(final_params(run_dir / "checkpoints"), uninterrupted)  # type: ignore
    assert not leftovers(pods.token)


def world_sizes(out: str) -> list[int]:
    """World size of each process group formed, in order (rank 0's ``joined`` line)."""
    return [int(m) for m in re.findall(r"\[rank 0/(\d+)\] joined:", out)]


TRIALS = int(os.environ.get("TORCHJOB_TRIALS", "1"))  # by hand: TORCHJOB_TRIALS=5


def test_an_elastic_job_survives_losing_worker_0(container_image: str, tmp_path: Path) -> None:
    """nnodes 1:2: the pod <job>-worker-0 (whose agent served the rendezvous before the store
    had a Deployment of its own) is taken away at step 30, never created again. The store keeps
    serving behind <job>-rdzv, worker-1 finishes alone at world size 2 from the newest
    checkpoint on the shared claim, the job succeeds as the operator judges it, and nothing is
    left. TORCHJOB_TRIALS times."""
    failures = []
    for trial in range(TRIALS):
        began = time.monotonic()
        name = f"pk-{secrets.token_hex(2)}"
        claim = tmp_path / f"trial{trial}"
        claim.mkdir()
        run_dir = claim / "runs" / name
        spec = load(ROOT / "jobs" / "examples" / "elastic.yaml",
                    [f"name={name}", "image=" + container_image, "k8s.pvc=runs",
                     "k8s.pvc_mount_path=/workspace", "trainer.args.epochs=3",
                     "trainer.args.batch_size=8", "trainer.args.checkpoint_every=10",
                     "trainer.args.log_every=1", "collective_timeout=30",
                     "hang_timeout=0",
                     # the first round waits for both pods (podman starts them seconds apart
                     # on a busy host), so that there are two to lose one of
                     "rdzv.last_call_timeout=20"])
        lost: list[str] = []

        def lose_worker_0(pods: PodJob) -> None:
            # both pods in one group first (a pod started late joins a later round)
            wait_for(lambda: (last_step(run_dir) >= 30 and 4 in world_sizes(out.getvalue()))
                     or pods.outcome is not None, 300, "step 30 at world size 4")
            if pods.outcome is None:
                victim = next(p for p in pods.pods if p.name == f"{name}-worker-0")
                pods.lose(victim)
                lost.append(victim.name)

        out = io.StringIO()  # the pods' lines as torchjob logs prints them
        code, pods = run(render_objects(spec, "pytorchjob"), {"runs": claim}, out=out,
                         during=lose_worker_0)
        logs = out.getvalue()
        (tmp_path / f"trial{trial}.log").write_text(logs)
        # after worker-0 is lost only worker-1's pod prints: the last group formed is its own
        sizes = world_sizes(logs)
        summary_file = run_dir / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
        problem = None
        if lost != [f"{name}-worker-0"]:
            problem = "worker-0 was not taken away mid-run"
        elif code != 0 or pods.why != "Succeeded":
            problem = f"exit {code} ({pods.why})"
        elif 4 not in sizes or sizes[-1:] != [2]:
            problem = f"not 4 processes, then worker-1's 2 alone: world sizes {sizes}"
        elif summary.get("world_size") != 2:
            problem = f"no summary at world size 2: {summary}"
        elif len(pods.stores) != 1 or pods.stores[0].incarnation != 0:
            problem = "the store pod did not serve the whole run"
        elif left := leftovers(pods.token):
            problem = f"left behind: {left}"
        print(f"trial {trial}: worker-0 lost at step >= 30: {problem or 'ok'} "
              f"(world sizes {sizes[0]}) in {time.monotonic() - began:.1f}s")
        if problem:
            failures.append(f"trial {trial}: {problem}\n{logs[-6000:]}")
    assert not failures, f"{len(failures)}/{TRIALS} trials failed:\n" + "\n".join(failures)


USER_SCRIPT = '''
import json, os
import torch, torch.distributed as dist
from helpers import greeting  # a module of the user's, next to the script
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
if dist.get_rank() == 0:
    with open(os.path.join(os.environ["TORCHJOB_RUN_DIR"], "result.json"), "w") as f:
        json.dump({"sum": total.item(), "greeting": greeting(), "file": __file__,
                   "cwd": os.getcwd()}, f)
dist.destroy_process_group()
'''


def test_a_users_script_runs_in_pods_from_an_image_built_from_the_working_directory(
        container_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``torchjob run --to k8s train.py`` where train.py and its helper module are only on this
    machine: the working directory is built into an image on top of the job's (what render
    shows), and two pods run the script from it, with no mount of this machine's files."""
    from tests.k8s.pods import podman
    from tests.k8s.pods_run import manifest

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(USER_SCRIPT)
    (folder / "helpers.py").write_text("def greeting():\n    return 'from the image'\n")
    claim = tmp_path / "claim"
    claim.mkdir()
    monkeypatch.chdir(folder)
    name = f"ws-{secrets.token_hex(2)}"
    objects, spec = manifest(["--nnodes", "2", "--name", name, "--set", "image=" + container_image,
                              "--set", "k8s.pvc=runs", "--set", "k8s.pvc_mount_path=/data",
                              "train.py"])
    try:
        assert spec.image.startswith(f"localhost/torchjob-workspace:{name}-"), spec.image
        code, pods = run(objects, {"runs": claim})
        logs = "\n".join(pods.logs_of(pod)[-3000:] for pod in pods.pods)
        assert code == 0 and pods.why == "Succeeded", logs
        assert not leftovers(pods.token)
        result = json.loads((claim / "runs" / name / "result.json").read_text())
        assert result == {"sum": 2.0, "greeting": "from the image",
                          "file": "/workspace/train.py", "cwd": "/workspace"}, result
    finally:
        podman("rmi", "--force", spec.image)  # the test leaves no image behind

"""The pod contract for real: one podman container per replica, named and resolvable as the
operator names its pods, with the pod's image, command and env plus exactly the env the
PyTorchJob operator injects (shared/K8S-CONTRACT.md), the run directory a PVC (a host
directory) shared by the pods. Training must complete with the right world size, and the job
succeed as the operator judges it. An elastic job's rendezvous store (its Deployment's pod,
reachable by its Service's name) runs too, and losing the Worker pod the endpoint pointed at
before the store had a pod of its own (worker-0) does not end the job. (The operator itself
cannot run here: tests/k8s/pods.py emulates what it does with the pods; the conformance
matrix's pod column runs on it too.)"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import time
from pathlib import Path

import pytest

from jobs.load import load
from k8s.render import render_objects
from tests.k8s.pods import PodJob, leftovers, run
from tests.procs import ROOT, last_step, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containers]


@pytest.mark.parametrize("job_file, sets, pod_names, world", [
    ("default.yaml", ["nnodes=2"], ["master-0", "worker-0"], 4),
    # the first round waits for both pods (podman may start them seconds apart)
    ("elastic.yaml", ["rdzv.last_call_timeout=20"], ["worker-0", "worker-1"], 4),
])
def test_rendered_pods_train_with_the_operators_env(container_image: str, tmp_path: Path,
                                                   job_file: str, sets: list[str],
                                                   pod_names: list[str], world: int) -> None:
    name = f"pc-{secrets.token_hex(2)}"
    spec = load(ROOT / "jobs" / "examples" / job_file,
                [*sets, f"name={name}", "trainer.args.epochs=2", "image=" + container_image,
                 "k8s.pvc=runs", "k8s.pvc_mount_path=/workspace"])
    code, pods = run(render_objects(spec, "pytorchjob"), {"runs": tmp_path})
    logs = "\n".join(pods.logs_of(pod)[-3000:] for pod in pods.pods)
    assert [pod.name for pod in pods.pods] == [f"{name}-{p}" for p in pod_names], logs
    assert code == 0 and pods.why == "Succeeded", logs
    assert not leftovers(pods.token)
    summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
    assert summary["world_size"] == world and summary["accuracy"] >= 0.9, summary


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
                     "trainer.args.log_every=1", "trainer.args.pg_timeout=30",
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

"""A rendered TrainJob's node command, run for real: two agents on this host as the two pods
of the ``node`` Job, each with exactly the env the v2.3 torch plugin and the kubelet give the
``node`` container, train together over gloo and finish on the shared run directory.

What is EMULATED (no cluster here): the controller's env injection (kubeflow/trainer v2.3.0
``pkg/runtime/framework/plugins/torch/torch.go``, ``EnforceMLPolicy``: PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK from the completion index, PET_MASTER_ADDR
``<job>-node-0-0.<job>``, PET_MASTER_PORT 29500), the kubelet's ``$(VAR)`` expansion
(``tests.k8s.kubelet``), the cluster DNS (node 0's name is 127.0.0.1 here: the one word the
test rewrites) and the ReadWriteMany claim (a folder both nodes mount at the claim's path).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from torchjob.jobs.load import loads
from torchjob.k8s.trainjob import master_host, render_trainjob
from tests.k8s.kubelet import expand
from tests.procs import PYTHON, env_for_tests, free_port

PLUGIN_PORT = "29500"  # constants.ContainerTrainerPort: PET_MASTER_PORT (unused with c10d)


def node_process(obj: dict, index: int, cwd: Path) -> subprocess.Popen[str]:
    """Pod ``index`` of the node Job: its command and env as the container would get them."""
    name, trainer = obj["metadata"]["name"], obj["spec"]["trainer"]
    plugin = {"PET_NNODES": str(trainer["numNodes"]),
              "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
              "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
              "PET_MASTER_PORT": PLUGIN_PORT}
    env = env_for_tests(**plugin)
    env.update({e["name"]: expand(e["value"], env) for e in trainer["env"] if "value" in e})
    env["PATH"] = os.pathsep.join([str(Path(PYTHON).parent), env["PATH"]])  # `python`
    host = plugin["PET_MASTER_ADDR"]
    argv = []
    for word in (expand(w, env) for w in trainer["command"]):
        if word == host or word.startswith(f"{host}:"):
            word = "127.0.0.1" + word[len(host):]  # the cluster DNS, emulated
        argv.append(word)
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_two_nodes_of_a_rendered_trainjob_train_with_the_plugins_env(tmp_path: Path) -> None:
    claim = tmp_path / "claim"  # the ReadWriteMany PVC, mounted at pvc_mount_path on both
    claim.mkdir()
    spec = loads("name: tj\nnnodes: 2\nnproc_per_node: 1\nhang_timeout: 60\n"
                 f"rdzv: {{port: {free_port()}, join_timeout: 120}}\n"
                 f"k8s: {{pvc: runs, pvc_mount_path: {json.dumps(str(claim))}}}\n"
                 "trainer: {args: {epochs: 1}}")
    obj = render_trainjob(spec)
    command = obj["spec"]["trainer"]["command"]
    assert command[3] == master_host(spec) and command[5:8] == ["python", "-m",
                                                                "torchjob.trainer.agent"]
    nodes = []
    for index in range(2):
        (tmp_path / f"pod{index}").mkdir()
        nodes.append(node_process(obj, index, tmp_path / f"pod{index}"))
    outputs = []
    try:
        for proc in nodes:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
    for index, (proc, out) in enumerate(zip(nodes, outputs)):
        assert proc.returncode == 0, f"pod {index} exited {proc.returncode}:\n{out[-4000:]}"
    run_dir = claim / "runs" / "tj"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2, summary
    assert (run_dir / "ledger.jsonl").exists(), "no ledger: the agent did not run"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())

"""On one GPU, as users run it: the built-in trainer (default job, gpt, FSDP2, torch.compile),
a worker's SIGKILL and a SIGTERM (bitwise equal to an uninterrupted run, synchronous and
background checkpoints), and a user's script and module over NCCL. One process per GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests import cuda_syncs
from tests.gpu.conftest import DEVICE
from tests.integration.test_gpt import MARGIN, baseline
from tests.procs import (PYTHON, ROOT, TORCHJOB, alive, assert_bitwise_equal, env_for_tests,
                         final_params, last_step, trainer_workers, wait_for)

pytestmark = pytest.mark.gpu
CUDA = DEVICE == "cuda"
BACKEND, WHERE, PRECISION = ("nccl", "cuda:0", "bf16") if CUDA else ("gloo", "cpu", "fp32")
RESTARTS = ["trainer.args.epochs=3", "trainer.args.checkpoint_every=10",
            "trainer.args.log_every=1", "trainer.args.progress=lines",
            "trainer.args.eval_every=0", "max_restarts=2"]


def run_argv(example: str, run_dir: Path, *sets: str) -> list[str]:
    """``torchjob run EXAMPLE`` on one process, in ``run_dir``, with ``sets``."""
    cmd = [*TORCHJOB, "run", str(ROOT / "jobs/examples" / example),
           "--set", "nproc_per_node=1", "--set", f"run_dir={run_dir}"]
    return cmd + [arg for s in sets for arg in ("--set", s)]


def run_ok(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for_tests(), capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_default_job_on_one_gpu(tmp_path: Path) -> None:
    out = run_ok(run_argv("default.yaml", tmp_path))
    assert f"backend {BACKEND}, device {WHERE}, precision {PRECISION}" in out, out[-3000:]
    result = summary(tmp_path)
    assert result["world_size"] == 1 and result["accuracy"] >= 0.98, result
    assert ("max_memory_allocated" in result) == CUDA, result


def test_profile_traces_the_gpu_kernels(tmp_path: Path) -> None:
    """``--profile``: the trace holds the GPU's kernels beside the host's operators, and the
    log's table is sorted by GPU time."""
    out = run_ok(run_argv("default.yaml", tmp_path, "trainer.args.epochs=1",
                          "trainer.args.profile=3:5"))
    assert ("Self CUDA" in out) == CUDA and "profile of steps 3-5" in out, out[-3000:]
    events = json.loads((tmp_path / "profile" / "rank0.json").read_text())["traceEvents"]
    kinds = {e.get("cat") for e in events}
    assert "cpu_op" in kinds and ("kernel" in kinds) == CUDA, kinds


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gpt_example_learns(tmp_path: Path, compiled: bool) -> None:
    """The gpt example's model, 150 steps of 32 windows (tests/integration/test_gpt.py's
    bar: 0.5 nats per byte below what the bytes' frequencies alone allow); compiled, its
    checkpoint resumes without --compile."""
    run_ok(run_argv("gpt.yaml", tmp_path, "trainer.args.gpt_layers=2",
                    "trainer.args.max_steps=150", "trainer.args.batch_size=32",
                    "trainer.args.eval_every_steps=0", "trainer.args.checkpoint_every=0",
                    f"trainer.args.compile={str(compiled).lower()}"))
    result = summary(tmp_path)
    assert result["steps"] == 150 and result["final_loss"] < baseline() - MARGIN, result
    if compiled:  # compiled in place: its checkpoint has the model's own keys
        out = run_ok(run_argv("gpt.yaml", tmp_path, "trainer.args.gpt_layers=2",
                              "trainer.args.max_steps=160", "trainer.args.batch_size=32",
                              "trainer.args.eval_every_steps=0",
                              "trainer.args.checkpoint_every=0"))
        assert "resumed from step_00000150" in out and summary(tmp_path)["steps"] == 160


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    run = tmp_path_factory.mktemp("reference")
    run_ok(run_argv("default.yaml", run, *RESTARTS))
    return final_params(run / "checkpoints")


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_sigkill_of_the_worker_restarts_bitwise_equal(tmp_path: Path, reference: dict,
                                                      background: bool) -> None:
    """Resumed from a checkpoint of CUDA state (written in the background too): the final
    parameters are those of a run that was never killed, to the bit."""
    cmd = run_argv("default.yaml", tmp_path, *RESTARTS,
                   f"trainer.args.async_checkpoint={str(background).lower()}")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env_for_tests(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: last_step(tmp_path) >= 25 or proc.poll() is not None, 300, "step 25")
        workers = trainer_workers(proc.pid)
        assert len(workers) == 1, f"expected one worker, found {workers}"
        os.kill(workers[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "restart 1" in out, out[-3000:]
    assert_bitwise_equal(final_params(tmp_path / "checkpoints"), reference)


def test_sigterm_checkpoints_exits_143_and_resumes(tmp_path: Path, reference: dict) -> None:
    proc = subprocess.Popen(run_argv("default.yaml", tmp_path, *RESTARTS), cwd=ROOT,
                            env=env_for_tests(), stderr=subprocess.PIPE, text=True)
    wait_for(lambda: last_step(tmp_path) >= 25 or proc.poll() is not None, 300, "step 25")
    workers = trainer_workers(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "stopped by SIGTERM" in err, err[-3000:]
    assert not [p for p in workers if alive(p)], "a worker outlived the launcher"
    out = run_ok(run_argv("default.yaml", tmp_path, *RESTARTS))
    assert "resumed from step_" in out
    assert_bitwise_equal(final_params(tmp_path / "checkpoints"), reference)


ASYNC_ROUND_TRIP = """
import sys, torch
from torchjob.trainer.checkpoint import Checkpointer, Position
device = torch.device(sys.argv[2])
def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 8)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
def checkpointer():
    return Checkpointer(sys.argv[1], rank=0, world_size=1, keep=2, async_save=True,
                        sharded=False, config={}, say=print)
model, opt = build()
ckpt = checkpointer()
ckpt.restore(model, opt, device)
ckpt.prepare(model, opt)
for step in range(1, 4):
    model(torch.randn(32, 64, device=device)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if step == 2:
        ckpt.save(Position(step, 0, 0), model, opt)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        moments = [s["exp_avg"].clone() for s in opt.state.values()]
ckpt.close()
again, opt2 = build()
assert checkpointer().restore(again, opt2, device).step == 2
assert all(torch.equal(again.state_dict()[k], v) for k, v in saved.items())
assert all(torch.equal(s["exp_avg"], m) for s, m in zip(opt2.state.values(), moments))
assert all(p.device == device for p in again.parameters())
print("restored exactly")
"""


def test_async_checkpoint_of_device_state_restores_exactly(tmp_path: Path) -> None:
    """Saved in the background at step 2 while step 3 trains on: the checkpoint holds step
    2's parameters and optimizer moments exactly, and they load back onto the device."""
    out = run_ok([PYTHON, "-c", textwrap.dedent(ASYNC_ROUND_TRIP), str(tmp_path),
                  "cuda:0" if CUDA else "cpu"])
    assert "restored exactly" in out


STOP_VOTE = """
import signal, sys, torch
import torch.distributed as dist
from torchjob.trainer.preempt import StopRequest
device = torch.device(sys.argv[2])
cuda = device.type == "cuda"
dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(sys.argv[1], 1),
                        rank=0, world_size=1, device_id=device if cuda else None)
for riding in (True, False):  # DDP's ballot; a vote of its own (FSDP2)
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512).to(device)
    if riding:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(64, 512, device=device)
    stop, said = StopRequest(0), []
    stop.ride(model, device)
    for step in range(1, 9):
        if step == 3 and cuda:  # DDP's first steps settle its buckets, which may wait
            torch.cuda.set_sync_debug_mode("error")  # any wait for the stream raises
        if step == 5:
            stop._handle(signal.SIGTERM, None)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        said.append(stop.agreed())
    if cuda:
        torch.cuda.set_sync_debug_mode("default")
    stop.settle()
    stop.restore()
    late = 1 if riding else 2  # the ballot: at its own step; a vote: in the next one's background
    assert said == [False] * (4 + late) + [True] * (4 - late), (riding, said)
dist.destroy_process_group()
print("voted without waiting")
"""


def test_the_stop_vote_never_waits_for_the_gpu(tmp_path: Path) -> None:
    """With several ranks every step votes on stopping (trainer.preempt); reading the vote must
    not wait for the GPU's queued work (it read it with ``.item()`` before). One GPU: a process
    group of one rank over NCCL, with DDP's ballot and with a vote of its own, torch's sync
    debug mode set to raise; the stop is agreed one step late, and two for a vote of its own."""
    out = run_ok([PYTHON, "-c", textwrap.dedent(STOP_VOTE), str(tmp_path / "store"),
                  "cuda:0" if CUDA else "cpu"])
    assert "voted without waiting" in out


def test_fsdp_at_world_size_1_says_it_trains_unsharded(tmp_path: Path) -> None:
    out = run_ok(run_argv("default.yaml", tmp_path, "trainer.args.parallel=fsdp",
                          "trainer.args.epochs=4"))
    assert "--parallel fsdp at world size 1: nothing to shard across" in out, out[-3000:]
    assert summary(tmp_path)["accuracy"] >= 0.9


@pytest.mark.parametrize("how", ["script", "module"])
def test_user_code_over_nccl(tmp_path: Path, how: str) -> None:
    """jobs/examples/ddp_script.py, which picks NCCL itself when CUDA is there."""
    sets = ["trainer.args.steps=20", "env.NCCL_DEBUG=INFO"]
    if how == "module":
        sets += ["trainer.script=", "trainer.module=torchjob.jobs.examples.ddp_script"]
    out = run_ok(run_argv("script.yaml", tmp_path, *sets))
    assert json.loads((tmp_path / "result.json").read_text())["world_size"] == 1
    assert ("NCCL INFO" in out) == CUDA, out[-3000:]


def test_a_training_step_never_waits_for_the_gpu(tmp_path: Path) -> None:
    """No line of the training loop makes the host wait for the GPU's queued work at every
    step (torch's sync debug mode, in the worker): the gpt example's 60 steps, logged once at
    the end, may wait at the warm-up's end, the log line and the last step, not 60 times at
    one place. Each such wait leaves the GPU idle while the loop prepares the next step (the
    blocking copy of each batch's labels did this before). One process: no stop vote here
    (test_the_stop_vote_never_waits_for_the_gpu)."""
    record = tmp_path / "record"
    proc = subprocess.run(
        run_argv("gpt.yaml", tmp_path / "run", "trainer.args.gpt_layers=2",
                 "trainer.args.max_steps=60", "trainer.args.batch_size=32",
                 "trainer.args.log_every=1000", "trainer.args.eval_every_steps=0",
                 "trainer.args.checkpoint_every=0"),
        cwd=ROOT, env=env_for_tests(**cuda_syncs.recording_env(record)), capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    records = cuda_syncs.read(record)
    assert [r["cuda"] for r in records if r["event"] == "armed"] == [CUDA], records[:5]
    waits = cuda_syncs.per_place(records, outside=("evaluate", "finish"))
    assert all(count <= 5 for count in waits.values()), (
        "lines that wait for the GPU (count of 60 steps):\n"
        + "\n".join(f"{count:4d} {where}" for where, count in waits.most_common()))
    assert CUDA or not waits, waits

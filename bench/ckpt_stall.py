"""How long a checkpoint holds up the training loop: ``--async-checkpoint true`` vs the
synchronous save, the same 1.1 GB state, side by side.

What is used: trainer/checkpoint.py's ``Checkpointer`` itself, driven as trainer/train.py
drives it (``save`` right after an ``optimizer.step``, then the loop's next step), one
process, a 92M-parameter MLP (torchjob.trainer.tasks.mlp) with fused AdamW: 370 MB of parameters and
740 MB of optimizer moments. Why not the whole trainer under DDP: two ranks of that model
would hold ~5 GB on a machine shared by other jobs, and the stall would drown in the step
time's noise; the loop's part in it is exactly these two calls.

The stall of a save is the time the loop is blocked by it: the ``save`` call, plus, for the
asynchronous save, the time the next ``optimizer.step`` waits for the background copy of the
state (``Checkpointer.held_s``). A synchronous save is blocked until the checkpoint is written,
fsynced, hashed and renamed. The directory is on the same disk as a run directory (not /tmp
if that were tmpfs). The first save of each kind is a row of its own: the trainer prepares
the background save's host buffers ahead (``Checkpointer.prepare``, after the first optimizer
step), and the loop runs ``LEAD_S`` of steps before its first save, as a run before its first
checkpoint. ``--device cuda``: model, optimizer state and batch on the GPU (the host buffers
are pinned); each step ends with a ``torch.cuda.synchronize``, so a stall is the loop's wait.
"""

from __future__ import annotations

import tempfile
import time

import device as dev
from common import ROOT, median, row, standalone

DIM, HIDDEN, LAYERS, CLASSES, BATCH = 2048, 4096, 6, 10, 4
LEAD_S = 2.0  # seconds of steps between the Checkpointer's start and its first save


def run(quick: bool = False, device: str = "cpu") -> list[dict]:
    dev.require(device)
    import torch
    import torch.nn.functional as F

    from torchjob.trainer.checkpoint import Checkpointer, Position
    from torchjob.trainer.tasks import mlp
    torch.manual_seed(0)
    model = mlp(DIM, HIDDEN, LAYERS, CLASSES).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(BATCH, DIM, device=device)
    y = torch.randint(0, CLASSES, (BATCH,), device=device)

    def step() -> float:
        began = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - began

    step()
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in opt.state.values()
                       for v in s.values() if torch.is_tensor(v))
    rounds = 3 if quick else 5
    stalls: dict[str, list[float]] = {"sync": [], "async": []}
    first: dict[str, float] = {}
    written: list[float] = []
    plain = [step() for _ in range(2)]
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "bench" / "results") as tmp:
        savers = {mode: Checkpointer(f"{tmp}/{mode}", rank=0, world_size=1, keep=1,
                                     async_save=mode == "async", sharded=False, config={},
                                     say=lambda m: None) for mode in stalls}
        for ck in savers.values():
            ck.prepare(model, opt)  # as the trainer, once its optimizer has stepped
        lead, began = [step()], time.perf_counter()
        while time.perf_counter() - began < LEAD_S:
            lead.append(step())
        for r in range(rounds + 1):
            for mode in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
                ck = savers[mode]
                step()
                held = getattr(ck, "held_s", 0.0)
                began = time.perf_counter()
                ck.save(Position(r + 1, 0, 0), model, opt)
                blocked = time.perf_counter() - began
                step()  # the loop goes on; its optimizer step waits for the async copy
                stall = blocked + getattr(ck, "held_s", 0.0) - held
                ck.wait()  # the write completes before the next save (and the other kind)
                if mode == "async":
                    written.append(time.perf_counter() - began)
                if r:
                    stalls[mode].append(stall)
                else:
                    first[mode] = stall
            print(f"  round {r}: sync {(stalls['sync'] or [first['sync']])[-1]:.4g} s, async "
                  f"{(stalls['async'] or [first['async']])[-1]:.4g} s", flush=True)
        for ck in savers.values():
            ck.close()
    sync, asyn = median(stalls["sync"]), median(stalls["async"])
    on = "" if device == "cpu" else f", {device}"
    gb = f"{state_bytes / 1e9:.2f} GB state"
    detail = dict(device=dev.name(device), sync_stall_s=[round(s, 3) for s in stalls["sync"]],
                  plain_step_s=[round(s, 4) for s in plain], state_bytes=state_bytes)
    return [row("checkpoint", f"loop stall of a save, {gb} (async vs sync, median{on})", asyn,
                sync, "<= 0.02", "s", async_stall_s=[round(s, 4) for s in stalls["async"]],
                async_save_to_written_s=[round(s, 2) for s in written[1:]], **detail),
            row("checkpoint", f"loop stall of the first async save, {gb} (vs sync, median{on})",
                first["async"], sync, "<= 0.02", "s", first_sync_stall_s=round(first["sync"], 3),
                lead_steps=len(lead), lead_step_s=round(median(lead), 4), **detail)]


if __name__ == "__main__":
    standalone(run, __doc__)

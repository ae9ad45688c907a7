"""The training run, top to bottom: environment, process group, data, model, loop, checkpoint.

Runs alone (``python -m torchjob.trainer``), under torchrun, under ``srun``, under an MPI launcher
or in a Kubernetes pod; only ``DistEnv.from_environ()`` knows the difference. Exit codes: 0 done,
2 bad configuration, 1 training failure, 143 stopped by a signal after a checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from torchjob.trainer import exporters, progress, stragglers
from torchjob.trainer.checkpoint import Checkpointer, Position
from torchjob.trainer.clock import Throughput
from torchjob.trainer.contract import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_STOPPED, RESUME_ENV
from torchjob.trainer.config import ConfigError, TrainConfig, parse_args
from torchjob.trainer.data import TrainBatches, eval_batches
from torchjob.trainer.dirs import unusable
from torchjob.trainer.dist import Group, process_group
from torchjob.trainer.env import DistEnv, EnvError
from torchjob.trainer.fingerprint import DATA
from torchjob.trainer.parallel import (autocast_context, clip_gradients, gradient_sync,
                                       same_statistics, settle_buckets, use_bf16, wrap)
from torchjob.trainer.profiling import StepProfiler
from torchjob.trainer.preempt import StopRequest
from torchjob.trainer.report import Reporter
from torchjob.trainer.samples import SampleLog
from torchjob.trainer.script import RAISED, record
from torchjob.trainer.tasks import Task, build_task



def main(argv: Sequence[str] | None = None, *, stopped_after_the_work: int = 0) -> int:
    """Train; the exit code. ``stopped_after_the_work`` is the code when a stop signal arrived
    after the last step's stop check: the work is done and checkpointed, so 0 by default."""
    try:
        cfg = parse_args(argv, os.environ)
        env = DistEnv.from_environ()
    except (ConfigError, EnvError) as exc:
        tell(f"trainer: {exc}")
        return EXIT_CONFIG
    stop = StopRequest(cfg.stop_grace)
    try:
        with process_group(env, cfg.backend, cfg.pg_timeout) as group:
            code = run(cfg, group, stop)
    except ConfigError as exc:
        tell(f"trainer [rank {env.rank}]: {exc}")
        record(exc)  # the agent's last line then says why
        RAISED.append(exc)  # kept until the process exits (trainer.script.RAISED)
        return EXIT_CONFIG
    finally:
        stop.restore()
    # checked once the process group is left: leaving it waits for the other ranks, and a
    # signal that lands there must end a worker at once as well
    if code == EXIT_OK and stop.signum is not None:
        tell(f"trainer [rank {env.rank}]: {stop.name} arrived after the last step: the work is "
             "done and its final checkpoint written")
        return stopped_after_the_work
    return code


def resume_mode(cfg: TrainConfig, environ: Mapping[str, str]) -> str:
    """How to treat the checkpoints found (torchjob.trainer.fingerprint): the launcher's
    ``TORCHJOB_RESUME`` (``fresh`` alone: once per run id); ``--resume false``: never resume,
    so every start moves the old ones aside (none is left to be resumed by mistake later)."""
    mode = environ.get(RESUME_ENV, "")
    if mode == "fresh":
        mode = f"fresh:{environ.get('TORCHELASTIC_RUN_ID', 'run')}"
    return mode if cfg.resume else f"fresh:{uuid.uuid4().hex}"


def tell(line: str) -> None:
    """One line to stderr in one write: under PYTHONUNBUFFERED (every launcher here sets it)
    print() writes the text and its newline separately, and ranks sharing a pipe interleave."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run(cfg: TrainConfig, group: Group, stop: StopRequest) -> int:
    """Train to the end (EXIT_OK), or to the checkpoint a stop asked for (EXIT_STOPPED)."""
    rep = reporter(cfg, group)
    task, batches = training_data(cfg, group)
    model, optimizer = model_and_optimizer(cfg, group, task, rep)
    ckpt, pos, total = restore(cfg, group, task, batches, rep, model, optimizer)
    samples = SampleLog.open(cfg.run_dir, group, pos) if cfg.log_samples else None
    loop = Loop(cfg, group, stop, rep, task, batches, model, optimizer, ckpt, samples, pos, total)
    try:
        return loop.epochs(pos)
    finally:
        rep.close()
        if samples:
            samples.close()


# -- the steps of a run, in order ---------------------------------------------------------------

def reporter(cfg: TrainConfig, group: Group) -> Reporter:
    """The run's reporter, once its directories are usable; every rank says where it joined."""
    for flag, value in (("--run-dir", cfg.run_dir), ("--checkpoint-dir", cfg.checkpoint_path)):
        problem = unusable(value)  # before any work, not at the first save
        if problem is not None:
            raise ConfigError(f"{flag} {value}: {problem}")
    rep = Reporter(cfg.run_dir, rank=group.rank, world_size=group.world_size,
                   progress=cfg.progress, log_every=cfg.log_every)
    env = group.env
    rep.exporters = exporters.build(cfg, exporters.run_info(
        cfg, rank=group.rank, local_rank=env.local_rank, node=env.node_rank,
        world_size=group.world_size), rep.every_rank)
    rep.every_rank(f"joined: rank {env.rank} local_rank {env.local_rank} world_size "
                   f"{env.world_size} master {env.master_addr}:{env.master_port} from "
                   f"{env.source}; backend {group.backend}, device {group.device}, precision "
                   f"{'bf16' if use_bf16(cfg.precision, group.device) else 'fp32'}, restart "
                   f"{env.restart_count}")
    return rep


def training_data(cfg: TrainConfig, group: Group) -> tuple[Task, TrainBatches]:
    """The task, read alike on every rank, and this rank's share of its training set."""
    task = build_task(cfg)
    same_data(task.identity, group)
    batches = TrainBatches(task.train, batch_size=cfg.batch_size, grad_accum=cfg.grad_accum,
                           world_size=group.world_size, rank=group.rank, seed=cfg.seed,
                           num_workers=cfg.num_workers)
    if batches.steps_per_epoch < 1:
        raise ConfigError(f"one optimizer step takes {batches.step_samples} samples (batch size "
                          f"{cfg.batch_size} x grad accum {cfg.grad_accum} x world size "
                          f"{group.world_size}) but the training set has {batches.size}: lower "
                          "--batch-size or --grad-accum")
    return task, batches


def model_and_optimizer(cfg: TrainConfig, group: Group, task: Task, rep: Reporter,
                        ) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The task's model, wrapped for data parallel training (DDP or FSDP), and its AdamW."""
    model = wrap(task.model, cfg, group, task.shard_units)
    if cfg.parallel == "fsdp" and group.world_size == 1:
        rep.say("--parallel fsdp at world size 1: nothing to shard across, so this rank holds "
                "every parameter, gradient and optimizer state (trains unsharded; --parallel "
                "ddp does the same without FSDP's per-block gathers)")
    # fused AdamW: one kernel per step instead of a loop of tensor ops
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  fused=cfg.parallel == "ddp")
    return model, optimizer


def restore(cfg: TrainConfig, group: Group, task: Task, batches: TrainBatches, rep: Reporter,
            model: nn.Module, optimizer: torch.optim.Optimizer,
            ) -> tuple[Checkpointer, Position, int]:
    """The checkpointer, the position it resumed from (the start when none) and the step the
    run ends at."""
    ckpt = Checkpointer(cfg.checkpoint_path, rank=group.rank, world_size=group.world_size,
                        keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoint,
                        sharded=cfg.parallel == "fsdp" and dist.is_initialized(),
                        config=kept_config(cfg, task), say=rep.say,
                        resume=resume_mode(cfg, os.environ))
    torch.manual_seed(cfg.seed * 1000 + group.rank)  # dropout stream; a checkpoint restores it
    # the same kernels every run: a resumed run ends bitwise where an uninterrupted one ends
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    pos = ckpt.restore(model, optimizer, group.device)
    ckpt.prepare(model, optimizer)  # a background save's buffers, made off the step path
    # the step this run ends at: an uninterrupted run's at one world size; after a resize,
    # the steps done so far plus those the new world size has left
    total = pos.step + batches.steps_to_end(pos.epoch, pos.samples, cfg.epochs)
    total = min(total, cfg.max_steps) if cfg.max_steps else total
    if ckpt.restored_world_size != group.world_size and pos.samples:
        rep.say(f"continuing epoch {pos.epoch} after its first {pos.samples} samples (of "
                f"{batches.size}) at world size {group.world_size}: "
                f"{batches.steps_after(pos.samples)} steps of {batches.step_samples} samples "
                "left in it")
    return ckpt, pos, total


class Loop:
    """The training loop, from ``pos`` to step ``total``, and its running state: the step,
    the loss since the last log line, each step's own work before its all-reduce
    (trainer.stragglers), and the step and scores of the last evaluation."""

    def __init__(self, cfg: TrainConfig, group: Group, stop: StopRequest, rep: Reporter,
                 task: Task, batches: TrainBatches, model: nn.Module,
                 optimizer: torch.optim.Optimizer, ckpt: Checkpointer,
                 samples: SampleLog | None, pos: Position, total: int) -> None:
        self.cfg, self.group, self.stop, self.rep, self.task = cfg, group, stop, rep, task
        self.batches, self.model, self.optimizer, self.ckpt = batches, model, optimizer, ckpt
        self.samples, self.total = samples, total
        self.autocast = autocast_context(cfg.precision, group.device,
                                         fsdp=cfg.parallel == "fsdp")
        stop.ride(model, group.device)  # before the first backward, which registers the hook
        settle_buckets(model, optimizer, task.train, group.device, self.autocast)
        self.global_batch = cfg.batch_size * cfg.grad_accum * group.world_size
        device = group.device  # on CUDA the rate is the device's, not the queue's
        self.clock = Throughput(warmup_steps=min(5, max(total - pos.step - 1, 0)), sync=(
            lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None)
        self.step, self.loss_sum, self.here = pos.step, torch.zeros((), device=group.device), pos
        self.work: list[float] = []
        self.logged = 0  # self.work[:logged] is in the step-time records already
        steps = cfg.profile_steps  # --profile: torch.profiler over these steps
        self.profiler = StepProfiler(steps, cfg.run_dir, group.rank, group.device, rep.say,
                                     start_step=pos.step, end_step=total) if steps else None
        self.evaluated = -1  # the step of the last evaluation
        self.scores: dict[str, float] = {}  # and its scores
        rep.say(f"training {total} steps ({batches.steps_per_epoch}/epoch, global batch "
                f"{self.global_batch}) from step {self.step}")

    def epochs(self, pos: Position) -> int:
        """Every epoch left, evaluated as asked, then the final checkpoint and summary."""
        cfg = self.cfg
        for epoch in range(pos.epoch, cfg.epochs):
            if self.epoch(epoch, pos.samples if epoch == pos.epoch else 0):
                return EXIT_STOPPED
            if self.evaluated != self.step and (
                    self.step >= self.total
                    or (cfg.eval_every and (epoch + 1) % cfg.eval_every == 0)):
                self.score(epoch, f"after epoch {epoch + 1}")
            if self.step >= self.total:
                break
        return self.finish()

    def epoch(self, epoch: int, start: int) -> bool:
        """One epoch from its sample ``start``; True when a stop ended it (checkpointed)."""
        cfg, model = self.cfg, self.model
        model.train()
        began = time.perf_counter()
        for micro, (x, y) in enumerate(self.batches.epoch(epoch, start)):
            if self.step >= self.total:  # a stop by max_steps mid-epoch keeps its position
                return False
            last = (micro + 1) % cfg.grad_accum == 0
            x, y = on_device(x, self.group.device), on_device(y, self.group.device)
            with gradient_sync(model, last), self.autocast:
                loss = self.task.objective.loss(model(x), y) / cfg.grad_accum
            if last:
                self.work.append(time.perf_counter() - began)
            loss.backward()
            self.loss_sum += loss.detach()
            if self.samples:
                self.samples.write(self.step + 1, epoch, self.batches.indices)
            if not last:
                continue
            self.update(epoch)
            if self.stop.agreed():
                self.stopped()
                return True
            if cfg.eval_every_steps and self.step % cfg.eval_every_steps == 0 \
                    and self.step < self.total:
                self.score(epoch, f"at step {self.step}")
            began = time.perf_counter()
        self.here = Position(self.step, epoch + 1, 0)  # the epoch is done
        return False

    def update(self, epoch: int) -> None:
        """The optimizer's step, then its log line and its periodic checkpoint."""
        cfg, rep, step = self.cfg, self.rep, self.step
        if cfg.clip_grad:
            clip_gradients(self.model, cfg.clip_grad, self.stop.buckets)
        lr = learning_rate(cfg, step, self.total)
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step = step = step + 1
        progress.step(step, self.total)  # for the agent (torchjob.trainer.progress)
        logs = step % cfg.log_every == 0 or step == self.total
        self.clock.tick(self.global_batch, exact=logs)
        self.here = Position(step, epoch, self.batches.position)
        if logs:
            shown = self.loss_sum.item()  # this rank's loss; a sync only every log_every
            rates = {"samples_per_s": round(self.clock.rate(), 1),
                     **self.task.objective.rates(self.clock.rate())}
            eta = self.clock.eta(self.total - step)
            rep.metric("train", step=step, total_steps=self.total, epoch=epoch, loss=shown,
                       lr=lr, **rates, eta_s=None if eta is None else round(eta, 1),
                       restart=self.group.env.restart_count)
            rep.step_times(step, self.group.env.restart_count,
                           stragglers.percentiles(self.work[self.logged:]))
            self.logged = len(self.work)
            rep.progress(step, self.total, {"epoch": epoch, **rates, "eta_s": eta},
                         loss=shown, lr=lr)
        elif rep.use_bar:
            rep.progress(step, self.total)
        self.loss_sum.zero_()
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            same_statistics(self.model)
            self.ckpt.save(self.here, self.model, self.optimizer)
        if self.profiler:
            self.profiler.after(step)

    def score(self, epoch: int, when: str) -> None:
        """Evaluate now (outside the throughput clock) and report it."""
        self.scores = self.clock.outside(lambda: evaluate(self.model, self.task, self.cfg,
                                                          self.group, self.autocast))
        report_eval(self.rep, self.scores, self.step, epoch, when)
        self.evaluated = self.step

    def stopped(self) -> None:
        """Every rank agreed to stop: the checkpoint of this step, then the last line."""
        if self.profiler:
            self.profiler.close()
        self.stop.settle()
        same_statistics(self.model)
        self.ckpt.save(self.here, self.model, self.optimizer, block=True)
        self.ckpt.close()
        self.rep.close()
        self.rep.every_rank(f"stopped by {self.stop.name} after step {self.step}: checkpoint "
                            "written; run the same command again to continue")

    def finish(self) -> int:
        """The final checkpoint, the final scores and the run's summary."""
        model, task, clock = self.model, self.task, self.clock
        if self.profiler:
            self.profiler.close()
        self.stop.settle()
        same_statistics(model)
        self.ckpt.save(self.here, model, self.optimizer, block=True)
        self.ckpt.close()
        # the last evaluation may have scored these very parameters; else score them now
        final = self.scores if self.evaluated == self.step else \
            evaluate(model, task, self.cfg, self.group, self.autocast)
        step_work = stragglers.report(gather(stragglers.percentiles(self.work)))
        self.rep.finish({"steps": self.step, "world_size": self.group.world_size,
                         "samples_per_s": round(clock.rate(), 1),
                         **task.objective.rates(clock.rate()),
                         "final_loss": final.get("loss", float("nan")),
                         **{name: final.get(name, float("nan"))
                            for name in task.objective.metrics[1:]},
                         "seconds": round(clock.elapsed(), 2), "step_work": step_work,
                         **peak_memory(self.group.device)},
                        stragglers.line(step_work))
        return EXIT_OK


# -- parts of the loop --------------------------------------------------------------------------

def learning_rate(cfg: TrainConfig, step: int, total: int) -> float:
    """Linear warm-up, then cosine to 10% (or constant); a pure function of the step, so a
    resumed run needs no scheduler state."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, cfg: TrainConfig, group: Group,
             autocast: contextlib.AbstractContextManager[Any]) -> dict[str, float]:
    """The task's metrics (trainer.objectives: loss and accuracy, or loss and perplexity) over
    the whole evaluation set, each sample counted once across ranks."""
    if task.eval is None:
        return {}
    same_statistics(model)  # every rank scores with rank 0's batch-norm statistics
    net = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    was_training = net.training
    net.eval()
    sums: torch.Tensor | None = None
    for x, y, w in eval_batches(task.eval, batch_size=max(cfg.batch_size, 256),
                                world_size=group.world_size, rank=group.rank):
        x, y, w = (on_device(t, group.device) for t in (x, y, w))
        with autocast:
            logits = net(x).float()
        batch = task.objective.eval_sums(logits, y, w)
        sums = batch if sums is None else sums + batch
    net.train(was_training)
    if sums is None:  # an empty evaluation set, on every rank alike
        return {}
    if dist.is_initialized():
        dist.all_reduce(sums)
    return task.objective.scores(sums.tolist())


def on_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``batch`` on the training device. To a GPU it goes from pinned memory without waiting:
    a copy from pageable memory (a batch indexed out of a tensor) may wait for the stream's
    queued work, and a blocking one (``.to(device)``) does, so the GPU would idle while the
    loop prepares the step."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def same_data(identity: str, group: Group) -> None:
    """Stop (exit 2) when ranks read different data from their machines (the gpt task's
    corpus on nodes with different Pythons): they would train on different text."""
    if not identity or not dist.is_initialized():
        return
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, (identity, group.rank, socket.gethostname()))
    odd = [(rank, host, seen) for seen, rank, host in every if seen != identity]
    if odd:
        rank, host, seen = odd[0]
        raise ConfigError(f"the ranks read different data: rank {group.rank} has {identity!r} "
                          f"but rank {rank} on {host} has {seen!r}; run every node with the "
                          "same Python (the gpt task reads its standard library)")


def kept_config(cfg: TrainConfig, task: Task) -> dict[str, Any]:
    """The config a checkpoint keeps (trainer.fingerprint), with the data the task read from
    this machine when that is not fixed by the config (``data``)."""
    config = dataclasses.asdict(cfg)
    return {**config, DATA: task.identity} if task.identity else config


def peak_memory(device: torch.device) -> dict[str, int]:
    """``max_memory_allocated`` (bytes) on a CUDA device; nothing elsewhere."""
    if device.type != "cuda":
        return {}
    return {"max_memory_allocated": torch.cuda.max_memory_allocated(device)}


def gather(mine: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's value, in rank order (one collective, at the end of the run)."""
    if not dist.is_initialized():
        return [mine]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def report_eval(rep: Reporter, result: dict[str, float], step: int, epoch: int,
                when: str) -> None:
    if result:
        rep.metric("eval", step=step, epoch=epoch, **result)
        shown = " ".join(f"{name} {value:.4f}" for name, value in result.items())
        rep.say(f"eval {when}: {shown}")

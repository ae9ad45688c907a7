"""Checkpoints that are either whole or absent: written under temporary names, verified by a
manifest of SHA-256s and renamed by rank 0. On start the newest one that verifies wins; a
damaged one is skipped with a warning naming what is wrong. Layout: docs/internals.md.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from torchjob.trainer.config import ConfigError
from torchjob.trainer.contract import MANIFEST
from torchjob.trainer.dirs import free_space, write_failure, write_whole
from torchjob.trainer.dist import from_rank0
from torchjob.trainer.fingerprint import differences, digest, refusal

FRESH_MARKER = ".fresh"  # the token of the submission that started over here (--fresh)
FORMAT = 1


@dataclass(frozen=True)
class Position:
    """Where training stands: optimizer steps done, and samples of ``epoch`` done by all ranks
    together (global, so it means the same at any world size: ``torchjob.trainer.data``)."""

    step: int = 0
    epoch: int = 0
    samples: int = 0

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> Position:
        """The position a manifest records; one written before positions were counted in
        samples (``micro``: micro-batches per rank) is converted, exactly."""
        pos = dict(manifest["position"])
        if "micro" in pos:
            micro = pos.pop("micro")
            pos["samples"] = micro * int(manifest["config"]["batch_size"]) * \
                int(manifest["world_size"])
        return cls(**pos)


class CheckpointError(RuntimeError):
    pass


class CheckpointWriteError(RuntimeError):
    """A save the file system refused (full, over quota, read-only, an I/O error)."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint ``path`` if every file it names is there and intact."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError("no manifest.json (the save did not finish)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"unreadable manifest.json ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"manifest.json is not format {FORMAT}")
    for name, digest in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{name} is missing")
        if sha256(file) != digest:
            raise CheckpointError(f"{name} does not match its checksum (truncated or damaged)")
    return manifest


class Checkpointer:
    """Saves and restores model, optimizer, RNG and position for every rank of a job."""

    def __init__(self, root: str, *, rank: int, world_size: int, keep: int, async_save: bool,
                 sharded: bool, config: dict[str, Any], say: Callable[[str], None],
                 resume: str = "") -> None:
        self.root = Path(root)
        # torchjob.trainer.fingerprint: "" (resume what matches), "force", or "fresh:TOKEN"
        self.resume = resume
        self.rank, self.world_size = rank, world_size
        self.keep, self.async_save, self.sharded = keep, async_save, sharded
        self.layout = "sharded" if sharded else "replicated"
        self.config = config
        self.say = say  # rank-0 logging helper
        self.last_step = -1
        self.restored_world_size = world_size  # world size of the checkpoint resumed from
        self._pending: concurrent.futures.Future[Any] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "checkpoint")
        self._group: Any = None
        self._staging: list[Any] | None = None  # reused host buffers for background saves
        self._staged = threading.Event()  # the background save's copy of the state is made
        self._staged.set()
        self._hooked: set[int] = set()  # optimizers whose step waits for that copy
        self.held_s = 0.0  # seconds optimizer steps waited for background copies (bench/)
        if async_save and sharded and dist.is_initialized():
            # background shard writes must not share a group with the loop's collectives
            self._group = dist.new_group(backend="gloo")

    # -- restore -------------------------------------------------------------------------------

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                device: torch.device) -> Position:
        """Load the newest checkpoint that verifies; Position() when there is none."""
        choice = from_rank0(self._choose() if self.rank == 0 else None)
        if isinstance(choice, str):  # rank 0 refused the checkpoints: every rank stops
            raise ConfigError(choice)
        if choice is None:
            return Position()
        path, manifest = Path(choice[0]), choice[1]
        if manifest.get("layout") != self.layout:
            raise ConfigError(f"checkpoint {path} holds {manifest.get('layout')} state but this "
                              f"run keeps {self.layout} state (--parallel changed?): resume with "
                              "the setting it was written with, or use a new --checkpoint-dir")
        if self.sharded:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        else:
            state = torch.load(path / "state.pt", map_location=device, weights_only=True)
            unwrap(model).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])
        rng = path / f"rng-rank{self.rank}.pt"
        if manifest["world_size"] != self.world_size:  # an elastic job grew or shrank
            self.say(f"world size changed from {manifest['world_size']} to {self.world_size}: "
                     f"continuing from {path.name}; random streams restart from the seed, so "
                     "this run will not match an uninterrupted one bit for bit")
        elif rng.exists():
            set_rng_state(torch.load(rng, weights_only=False))
        else:
            self.say(f"{rng.name} is missing from {path.name}: random streams restart from the "
                     "seed, so this run will not match an uninterrupted one bit for bit")
        pos = Position.from_manifest(manifest)
        self.restored_world_size = int(manifest["world_size"])
        self.last_step = pos.step
        self.say(f"resumed from {path.name} (step {pos.step}, epoch {pos.epoch}, "
                 f"{pos.samples} samples into it)")
        return pos

    def _choose(self) -> tuple[str, dict[str, Any]] | str | None:
        """Rank 0: the newest checkpoint that verifies and belongs to this configuration;
        None; or why the checkpoints found are refused (another configuration)."""
        if self.resume.startswith("fresh:"):
            self._start_over(self.resume.removeprefix("fresh:"))
        if not self.root.is_dir():
            return None
        for stale in self.root.glob(".tmp-*"):  # a save that never finished; nobody writes now
            shutil.rmtree(stale, ignore_errors=True)
        for path in sorted(self.root.glob("step_*"), reverse=True):
            try:
                manifest = verify(path)
            except CheckpointError as exc:
                self.say(f"WARNING: skipping checkpoint {path.name}: {exc}; "
                         "falling back to an older one")
                continue
            diffs = differences(manifest.get("config", {}), self.config)
            if diffs and self.resume != "force":
                return refusal(str(self.root), diffs)
            if diffs:
                self.say(f"WARNING: --resume=force: resuming {path.name}, written with "
                         + "; ".join(f"{name} {old!r} (now {new!r})" for name, old, new in diffs))
            return str(path), manifest
        return None

    def _start_over(self, token: str) -> None:
        """``--fresh``, once per submission (``token``): checkpoints found here are moved
        aside to ``CHECKPOINT_DIR.old-TIME``, never deleted; a restart of the same
        submission finds its token and resumes its own."""
        marker = self.root / FRESH_MARKER
        if marker.is_file() and marker.read_text() == token:
            return
        if self.root.is_dir() and any(self.root.iterdir()):
            aside = self.root.with_name(f"{self.root.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
            while aside.exists():
                aside = aside.with_name(aside.name + "-1")
            os.rename(self.root, aside)
            self.say(f"--fresh: the checkpoints already in {self.root} were moved to {aside}; "
                     "starting over")
        self.root.mkdir(parents=True, exist_ok=True)
        write_whole(marker, token, self.root / f".tmp-{FRESH_MARKER}")

    # -- save ----------------------------------------------------------------------------------

    def save(self, pos: Position, model: nn.Module, optimizer: torch.optim.Optimizer, *,
             block: bool = False) -> None:
        """Write a checkpoint at ``pos``; in the background when asynchronous unless ``block``."""
        self.wait()  # one save in flight at a time
        if pos.step == self.last_step:  # decided from memory: every rank agrees without I/O
            return
        self.last_step = pos.step
        name = f"step_{pos.step:08d}"
        tmp = self.root / f".tmp-{name}-{self._shared_token()}"
        with self._writing(tmp, name):
            tmp.mkdir(parents=True, exist_ok=True)
            write(tmp / f"rng-rank{self.rank}.pt", get_rng_state())  # rank 0 fsyncs all files
        background = self.async_save and not block
        if self.sharded:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            if background:  # staged to memory now, written while training goes on
                upload: Any = dcp.async_save(state, checkpoint_id=str(tmp),
                                             process_group=self._group)
                if hasattr(upload, "upload_completion"):  # newer torch stages asynchronously
                    upload.staging_completion.result()
                    upload = upload.upload_completion
                self._pending = self._pool.submit(self._finish_after, upload, tmp, name, pos)
            else:  # returns on every rank once all shards and the metadata are written
                with self._writing(tmp, name):
                    dcp.save(state, checkpoint_id=str(tmp))
                    self._finish(tmp, name, pos)
            return
        if dist.is_initialized():
            dist.barrier()  # every rank's RNG file is on disk before rank 0 can finish
        if self.rank != 0:
            return
        state = {"model": unwrap(model).state_dict(), "optim": optimizer.state_dict()}
        if not background:
            self._write_and_finish(state, tmp, name, pos)
            return
        # The loop goes on at once. What only the optimizer's step changes (parameters and
        # optimizer state: nearly all of it) is copied in the background, and the next
        # optimizer step waits for that copy; the rest (buffers such as batch-norm statistics,
        # which the next forward changes) is copied here. Then serialise, hash and rename, still
        # in the background: the file holds the state of this moment, as a synchronous save.
        leaves, spec = tree_flatten(state)
        later = stepped_storages(optimizer)
        deferred = [torch.is_tensor(v) and storage_key(v) in later for v in leaves]
        staging = self._buffers(leaves)
        for buf, leaf, defer in zip(staging, leaves, deferred):
            if torch.is_tensor(leaf) and not defer:
                buf.copy_(leaf.detach())
        if id(optimizer) not in self._hooked:  # kept: removing it inside a step is unsafe
            optimizer.register_step_pre_hook(lambda *_: self._wait_staged())
            self._hooked.add(id(optimizer))
        self._staged.clear()
        self._pending = self._pool.submit(self._stage_write_finish, staging, leaves, deferred,
                                          spec, tmp, name, pos)

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """For background saves of replicated state: once the first optimizer step has made
        the optimizer's state, allocate the host buffers of a save (pinned with CUDA: ~1 s
        for 2 GB) in the background, so that the first save does not stall the loop for it."""
        if not self.async_save or self.sharded or self.rank != 0:
            return
        done = False

        def allocate(*_: Any) -> None:
            nonlocal done
            if not done and self._pending is None and self._staging is None:
                state = {"model": unwrap(model).state_dict(), "optim": optimizer.state_dict()}
                self._pending = self._pool.submit(self._buffers, tree_flatten(state)[0])
            done = True

        optimizer.register_step_post_hook(allocate)  # a flag turns it off: no removal mid-step

    def wait(self) -> None:
        """Block until the save in flight (if any) is complete and renamed."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                pending.result()
            finally:
                self._wait_staged()

    def _wait_staged(self) -> None:
        """Block until the background save has its copy of the state (the optimizer step
        pre-hook: the step must not change what is being copied)."""
        if not self._staged.is_set():
            began = time.perf_counter()
            self._staged.wait()
            self.held_s += time.perf_counter() - began

    def close(self) -> None:
        self.wait()
        self._pool.shutdown()

    def _buffers(self, leaves: list[Any]) -> list[Any]:
        """Host buffers for ``leaves``' tensors, kept from the last save when the shapes
        match (one save is in flight at a time), so a save allocates nothing after the first;
        pinned when CUDA is there, for fast copies from the device."""
        staging = self._staging
        if staging is None or len(staging) != len(leaves) or any(
                torch.is_tensor(v) and (not torch.is_tensor(b) or b.shape != v.shape
                                        or b.dtype != v.dtype) for b, v in zip(staging, leaves)):
            pin = torch.cuda.is_available()
            staging = [torch.empty(v.shape, dtype=v.dtype, pin_memory=pin)
                       if torch.is_tensor(v) else v for v in leaves]
        else:
            staging = [b if torch.is_tensor(v) else v for b, v in zip(staging, leaves)]
        self._staging = staging
        return staging

    def _stage_write_finish(self, staging: list[Any], leaves: list[Any], deferred: list[bool],
                            spec: Any, tmp: Path, name: str, pos: Position) -> None:
        """In the background: copy the deferred tensors (the next optimizer step waits for
        it), then write and finish as a synchronous save does."""
        try:
            for buf, leaf, defer in zip(staging, leaves, deferred):
                if defer:
                    buf.copy_(leaf.detach(), non_blocking=buf.is_pinned())
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        finally:
            self._staged.set()
        self._write_and_finish(tree_unflatten(staging, spec), tmp, name, pos)

    def _shared_token(self) -> str:
        return str(from_rank0(uuid.uuid4().hex[:8]))

    def _write_and_finish(self, state: dict[str, Any], tmp: Path, name: str,
                          pos: Position) -> None:
        with self._writing(tmp, name):
            write(tmp / "state.pt", state)
            self._finish(tmp, name, pos)

    def _finish_after(self, upload: concurrent.futures.Future[Any], tmp: Path, name: str,
                      pos: Position) -> None:
        with self._writing(tmp, name):
            upload.result()  # on rank 0: after every rank's shards and the metadata
            self._finish(tmp, name, pos)

    @contextlib.contextmanager
    def _writing(self, tmp: Path, name: str) -> Iterator[None]:
        """A save the file system refuses (a full disk, a quota, an I/O error) removes what
        it wrote, which a full disk needs back, and fails with where, what is free there and
        what to do; the checkpoints before it are untouched."""
        try:
            yield
        except BaseException as exc:  # torch.distributed.checkpoint's is no Exception
            if isinstance(exc, (CheckpointWriteError, KeyboardInterrupt, SystemExit)):
                raise
            cause = write_failure(exc)
            if cause is None:
                if isinstance(exc, Exception):
                    raise
                said = (str(exc).splitlines() or [type(exc).__name__])[0]
                raise RuntimeError(f"saving checkpoint {name} failed: {said}") from exc
            shutil.rmtree(tmp, ignore_errors=True)
            done = sorted(p.name for p in self.root.glob("step_*"))
            kept = f"the newest one there is {done[-1]}" if done else "none was written before"
            raise CheckpointWriteError(
                f"cannot write checkpoint {name} in {self.root}: {cause} "
                f"({free_space(self.root)} free there); {kept}. Free space there (or raise "
                "the quota), or set checkpoint_dir to another file system, and run the job "
                "again to resume") from exc

    def _finish(self, tmp: Path, name: str, pos: Position) -> None:
        """Rank 0: checksum every file, write the manifest, rename into place, prune."""
        if self.rank != 0:
            return
        files = {}
        for file in sorted(tmp.iterdir()):
            with open(file, "rb+") as fh:
                os.fsync(fh.fileno())
            files[file.name] = sha256(file)
        manifest = {"format": FORMAT, "layout": self.layout, "position": pos.__dict__,
                    "world_size": self.world_size, "config": self.config,
                    "fingerprint": digest(self.config), "files": files}
        with open(tmp / MANIFEST, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        target = self.root / name
        replaced = None
        if target.exists():  # one we fell back past (damaged): this run has rewritten its step
            replaced = tmp.with_name(f"{tmp.name}-replaced")  # a .tmp-* name: cleaned if we die
            os.rename(target, replaced)
            self.say(f"replacing {name}, which did not verify, with this run's checkpoint")
        os.rename(tmp, target)
        fsync_dir(self.root)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
        # keep the newest N up to this step; newer ones are damaged ones we fell back past,
        # left for the user to inspect until this run writes their step again
        mine = [p for p in self.root.glob("step_*") if p.name <= name]
        for old in sorted(mine, reverse=True)[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """Which memory a tensor views (a state dict's entries are views of the live tensors)."""
    return str(t.device), t.untyped_storage().data_ptr()


def stepped_storages(optimizer: torch.optim.Optimizer) -> set[tuple[str, int]]:
    """The memory that only ``optimizer.step`` changes: its parameters and its state."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    tensors += [v for state in optimizer.state.values() for v in state.values()
                if torch.is_tensor(v)]
    return {storage_key(t) for t in tensors}


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel (its state dict keys carry no prefix)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def write(path: Path, obj: Any) -> None:
    with open(path, "wb") as fh:
        torch.save(obj, fh)


def get_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Ultralytics' per-epoch checkpoint save, moved off the training thread.

Ultralytics' `save_model` deep-copies the EMA's module tree, casts it to fp16, checks and pickles every tensor (on a
GPU one host sync each) and writes last.pt while every rank waits at the next collective: 0.17-0.31 s of a 3.2 s
YOLO11n epoch on 2 x H200. Here the training thread only copies what the checkpoint holds to host memory, one
transfer per device and dtype, and a writer thread runs Ultralytics' own `save_model` on that copy: the checkpoint is
upstream's format, byte for byte the same kind of file, and the training thread is back on the GPU within
milliseconds.

Each epoch's last.pt is also kept, as a hard link, in a staging directory beside it until whoever reports it (yolo_ray's
Ray reporter) has persisted it and calls `release`: the next epoch replaces last.pt by a rename, never in place.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

STAGING_PREFIX = ".yolo_ray_ckpt_"  # an epoch's staging directory beside last.pt
AWAITING_PREFIX = ".yolo_ray_val_epoch"  # train.val_async: an epoch's last.pt, kept until its validation result is in
EMA_ATTRS = ("yaml", "nc", "args", "names", "stride", "class_weights")  # what ModelEMA.update_attr copies


@dataclass
class SavedCheckpoint:
    """An epoch's checkpoint on disk: `directory` holds its last.pt (a hard link to what the epoch wrote)."""

    directory: Path
    weights_sha256: str  # the EMA's parameters as last.pt stores them (fp16): what a resumed run starts from
    write_s: float  # the writer thread's time: Ultralytics' save_model on the snapshot, and the renames


class CheckpointWriter:
    """Runs a trainer's `save_model` on host snapshots, one at a time, in order, on a thread of its own."""

    def __init__(self, trainer: Any, save_model: Any, keep_for_validation: bool = False):
        """save_model: Ultralytics' unbound `save_model`, called with a frozen view of `trainer`. keep_for_validation
        (train.val_async): each epoch's last.pt is also linked into its awaiting directory (worker/async_val.py), and
        best.pt is never written here (its epoch is known only once the validation comes back)."""
        self.trainer, self.save_model = trainer, save_model
        self.keep_for_validation = keep_for_validation
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yolo_ray-ckpt")
        self._saves: dict[int, Future[SavedCheckpoint]] = {}
        self._shadow: nn.Module | None = None  # a CPU copy of the EMA module that each snapshot is loaded into

    def save(self) -> bool:
        """Snapshot the trainer's checkpoint state now and write it in the background; False when the EMA holds
        non-finite values (then the caller saves synchronously: Ultralytics repairs the live EMA in that case)."""
        t = self.trainer
        ema_keys, ema_values = zip(*t.ema.ema.state_dict().items(), strict=True)
        ema_host, finite = host_copies(list(ema_values))
        if not finite:
            return False
        if self._shadow is None:  # once per run: the module tree, on the CPU (deep-copying it is the costly part)
            self._shadow = copy.deepcopy(t.ema.ema).to("cpu")
        frozen = {
            "epoch": t.epoch,
            "best_fitness": t.best_fitness,
            "fitness": math.nan if self.keep_for_validation else t.fitness,  # NaN equals no best_fitness
            "metrics": dict(t.metrics),
            "stopper": SimpleNamespace(best_fitness=t.stopper.best_fitness, best_epoch=t.stopper.best_epoch),
            "ema_updates": t.ema.updates,
            "ema_attrs": {k: copy.deepcopy(getattr(t.ema.ema, k)) for k in EMA_ATTRS if hasattr(t.ema.ema, k)},
            "optimizer": optimizer_host_copy(t.optimizer.state_dict()),
            "scaler": t.scaler.state_dict(),
            "args": copy.copy(t.args),
            "results": t.read_results_csv(),
        }
        state = dict(zip(ema_keys, ema_host, strict=True))
        self._saves[t.epoch] = self._pool.submit(self._write, state, frozen)
        return True

    def saved(self, epoch: int) -> SavedCheckpoint:
        """Epoch `epoch`'s checkpoint, once written (re-raises the writer's error)."""
        return self._saves[epoch].result()

    def flush(self) -> None:
        """Wait for every submitted save (before anything reads last.pt or best.pt)."""
        for f in list(self._saves.values()):
            f.result()

    def has(self, epoch: int) -> bool:
        return epoch in self._saves

    def staging_dir(self, epoch: int) -> Path:
        """Where epoch `epoch`'s last.pt is kept (a hard link) until `release`."""
        return self.trainer.last.parent / f"{STAGING_PREFIX}epoch{epoch}"

    def release(self, epoch: int) -> None:
        """The reporter persisted epoch `epoch`: drop its staging directory."""
        saved = self._saves.pop(epoch).result()
        shutil.rmtree(saved.directory, ignore_errors=True)

    def adopt(self, epoch: int) -> None:
        """Record a last.pt the trainer wrote itself, synchronously, as epoch `epoch`'s checkpoint (the caller
        flushed the writer before writing it)."""
        done: Future[SavedCheckpoint] = Future()
        t = self.trainer
        self._keep(epoch, t.last)
        done.set_result(SavedCheckpoint(self._stage(epoch), weights_digest(t.ema.ema, as_saved=True), 0.0))
        self._saves[epoch] = done

    def close(self) -> None:
        """Finish the pending saves and stop the writer thread."""
        self._pool.shutdown(wait=True)

    def _write(self, state: dict[str, torch.Tensor], frozen: dict) -> SavedCheckpoint:
        started = time.perf_counter()
        shadow = self._shadow
        assert shadow is not None
        shadow.load_state_dict(state)  # copies into the shadow's own tensors
        for k, v in frozen["ema_attrs"].items():
            setattr(shadow, k, v)
        t = self.trainer
        last, best = t.last, t.best
        view = _Frozen(
            t,
            ema=SimpleNamespace(ema=shadow, updates=frozen["ema_updates"]),
            optimizer=SimpleNamespace(state_dict=lambda: _own_storage(frozen["optimizer"])),
            scaler=SimpleNamespace(state_dict=lambda: frozen["scaler"]),
            read_results_csv=lambda: frozen["results"],
            model=shadow,  # Ultralytics' repair of a non-finite EMA reads the model; save() refused that case
            last=_partial(last),
            best=_partial(best),
            **{k: frozen[k] for k in ("epoch", "best_fitness", "fitness", "metrics", "stopper", "args")},
        )
        for p in (view.last, view.best):
            p.unlink(missing_ok=True)
        self.save_model(view)
        epoch = frozen["epoch"]
        directory = self._stage(epoch, view.last)
        self._keep(epoch, view.last)
        os.replace(view.last, last)  # a rename: the staged link keeps this epoch's bytes whatever comes next
        if view.best.exists():
            os.replace(view.best, best)
        digest = weights_digest(shadow, as_saved=True)
        return SavedCheckpoint(directory, digest, time.perf_counter() - started)

    def _stage(self, epoch: int, written: Path | None = None) -> Path:
        """A staging directory holding a hard link to epoch `epoch`'s last.pt (a copy where links are refused)."""
        return _linked(self.staging_dir(epoch), written or self.trainer.last)

    def _keep(self, epoch: int, written: Path) -> None:
        if self.keep_for_validation:
            _linked(awaiting_dir(written.parent, epoch), written)


def awaiting_dir(weights_dir: Path, epoch: int) -> Path:
    """Where epoch `epoch`'s (0-based) last.pt waits for its validation (worker/async_val.py promotes or drops it)."""
    return weights_dir / f"{AWAITING_PREFIX}{epoch}"


def _linked(directory: Path, source: Path) -> Path:
    """`directory`, made afresh, holding `source` as last.pt: a hard link, or a copy where links are refused."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    try:
        os.link(source, directory / "last.pt")
    except OSError:
        shutil.copy2(source, directory / "last.pt")
    return directory


class _Frozen:
    """The trainer as it was when the snapshot was taken: the given attributes, the rest read from the trainer
    (paths and settings that do not change during a run)."""

    def __init__(self, trainer: Any, **fixed: Any):
        self.__dict__.update(fixed)
        self._trainer = trainer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_trainer"], name)


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


def host_copies(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
    """Host copies of `tensors`, made with one concatenation and one transfer per (device, dtype) instead of one
    sync per tensor; also whether every floating-point value is finite. The copies are views of one buffer per
    group (clone them before pickling, or each would carry the whole buffer)."""
    out: list[torch.Tensor | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, x in enumerate(tensors):
        groups.setdefault((x.device, x.dtype), []).append(i)
    finite = True
    for (_, dtype), idx in groups.items():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])  # reshape: logical order, any layout
        if dtype.is_floating_point:
            finite = finite and bool(torch.isfinite(flat).all())
        host = flat.to("cpu")
        offset = 0
        for i in idx:
            n = tensors[i].numel()
            out[i] = host[offset : offset + n].view(tensors[i].shape)
            offset += n
    return out, finite  # type: ignore[return-value]


def optimizer_host_copy(state_dict: dict) -> dict:
    """An optimizer state_dict with its state tensors copied to the host (views: see host_copies)."""
    slots = [(p, k) for p, s in state_dict["state"].items() for k, v in s.items() if isinstance(v, torch.Tensor)]
    copies, _ = host_copies([state_dict["state"][p][k] for p, k in slots])
    state = {p: dict(s) for p, s in state_dict["state"].items()}
    for (p, k), v in zip(slots, copies, strict=True):
        state[p][k] = v
    return {"state": state, "param_groups": copy.deepcopy(state_dict["param_groups"])}


def _own_storage(state_dict: dict) -> dict:
    """The optimizer state with each tensor in storage of its own: a view would pickle its whole group."""
    state = {
        p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for p, s in state_dict["state"].items()
    }
    return {"state": state, "param_groups": state_dict["param_groups"]}


def weights_digest(module: nn.Module, as_saved: bool = False) -> str:
    """SHA-256 of a module's parameters (names and values, in order); as_saved: rounded to fp16 as last.pt stores
    them. One device-to-host copy of all of them, not one sync per tensor: it runs every epoch."""
    names, tensors = zip(*module.named_parameters(), strict=True)
    flat = torch.cat([p.detach().reshape(-1).float() for p in tensors])
    flat = flat.half() if as_saved else flat  # fp16 bytes: half the hashing, which costs ~0.1 s on YOLO11m in fp32
    h = hashlib.sha256("\n".join(names).encode())
    h.update(flat.cpu().numpy().tobytes())
    return h.hexdigest()

"""Ultralytics' per-epoch checkpoint save, moved off the training process.

Ultralytics' `save_model` deep-copies the EMA's module tree, casts it to fp16, checks and pickles every tensor (on a
GPU one host sync each) and writes last.pt while every rank waits at the next collective: 0.17-0.31 s of a 3.2 s
YOLO11n epoch on 2 x H200. Here the training thread only copies what the checkpoint holds to host memory (shared
memory, one transfer per device and dtype), and a writer process runs Ultralytics' own `save_model` on that copy:
the checkpoint is upstream's format, the same kind of file, and the training thread is back on the GPU within
milliseconds. A process, not a thread: a writer thread held the interpreter lock for ~0.28 s per epoch (deepcopy,
fp16 cast, pickling), which slowed the next epoch's loop by ~1.5% on one H200.

The writer process is forked from the training process at the first save, with a CPU copy of the EMA module (the
module tree is copied once per run, not once per epoch) and the trainer's paths and settings; it never touches a
GPU. Each epoch's last.pt is also kept, as a hard link, in a staging directory beside it until whoever reports it
(yolo_ray's Ray reporter) has persisted it and calls `release`: the next epoch replaces last.pt by a rename, never in
place.
"""

from __future__ import annotations

import copy
import hashlib
import multiprocessing
import os
import queue
import shutil
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions that pass CPU tensors as shared memory)
from torch import nn

STAGING_PREFIX = ".yolo_ray_ckpt_"  # an epoch's staging directory beside last.pt
EMA_ATTRS = ("yaml", "nc", "args", "names", "stride", "class_weights")  # what ModelEMA.update_attr copies
PARENT_CHECK_S = 5.0  # how often an idle writer process checks that the training process is still there


@dataclass
class SavedCheckpoint:
    """An epoch's checkpoint on disk: `directory` holds its last.pt (a hard link to what the epoch wrote)."""

    directory: Path
    weights_sha256: str  # the EMA's parameters as last.pt stores them (fp16): what a resumed run starts from
    write_s: float  # the writer process's time: Ultralytics' save_model on the snapshot, and the renames


@dataclass
class HostTensors:
    """Host copies of a list of tensors: one flat buffer per (device, dtype), in shared memory, and where each tensor
    lies in them. What crosses to the writer process is a few buffers, not hundreds of tensors."""

    flats: list[torch.Tensor]
    where: list[tuple[int, int, torch.Size]]  # per tensor: (flat, offset, shape)

    def tensors(self) -> list[torch.Tensor]:
        """The copies, as views of the flat buffers (clone one before pickling it, or it carries its whole buffer)."""
        return [self.flats[f][o : o + shape.numel()].view(shape) for f, o, shape in self.where]


class CheckpointWriter:
    """Runs a trainer's `save_model` on host snapshots, one at a time, in order, in a process of its own."""

    def __init__(self, trainer: Any, save_model: Any):
        """save_model: Ultralytics' unbound `save_model`, called with a frozen view of `trainer`."""
        self.trainer, self.save_model = trainer, save_model
        self._saves: dict[int, Future[SavedCheckpoint]] = {}
        self._shadow: nn.Module | None = None  # the writer process's CPU copy of the EMA module
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._lock = threading.Lock()  # _saves is read by the reply thread and Ray's upload thread

    def save(self) -> bool:
        """Snapshot the trainer's checkpoint state now and write it in the background; False when the EMA holds
        non-finite values (then the caller saves synchronously: Ultralytics repairs the live EMA in that case)."""
        t = self.trainer
        ema_keys, ema_values = zip(*t.ema.ema.state_dict().items(), strict=True)
        ema_host, finite = host_copies(list(ema_values))
        if not finite:
            return False
        if self._proc is None:
            self._start()
        elif not self._proc.is_alive():
            raise RuntimeError(f"the checkpoint writer process exited (code {self._proc.exitcode})")
        frozen = {
            "epoch": t.epoch,
            "best_fitness": t.best_fitness,
            "fitness": t.fitness,
            "metrics": dict(t.metrics),
            "stopper": SimpleNamespace(best_fitness=t.stopper.best_fitness, best_epoch=t.stopper.best_epoch),
            "ema_updates": t.ema.updates,
            "ema_attrs": {k: _on_cpu(getattr(t.ema.ema, k)) for k in EMA_ATTRS if hasattr(t.ema.ema, k)},
            "optimizer": optimizer_snapshot(t.optimizer.state_dict()),
            "scaler": t.scaler.state_dict(),
            "args": copy.copy(t.args),
            "results": t.read_results_csv(),
        }
        with self._lock:
            self._saves[t.epoch] = Future()
        self._requests.put((list(ema_keys), ema_host, frozen))
        return True

    def saved(self, epoch: int) -> SavedCheckpoint:
        """Epoch `epoch`'s checkpoint, once written (re-raises the writer's error)."""
        with self._lock:
            pending = self._saves[epoch]
        return pending.result()

    def flush(self) -> None:
        """Wait for every submitted save (before anything reads last.pt or best.pt)."""
        with self._lock:
            pending = list(self._saves.values())
        for f in pending:
            f.result()

    def has(self, epoch: int) -> bool:
        with self._lock:
            return epoch in self._saves

    def staging_dir(self, epoch: int) -> Path:
        """Where epoch `epoch`'s last.pt is kept (a hard link) until `release`."""
        return self.trainer.last.parent / f"{STAGING_PREFIX}epoch{epoch}"

    def release(self, epoch: int) -> None:
        """The reporter persisted epoch `epoch`: drop its staging directory."""
        with self._lock:
            pending = self._saves.pop(epoch)
        shutil.rmtree(pending.result().directory, ignore_errors=True)

    def adopt(self, epoch: int) -> None:
        """Record a last.pt the trainer wrote itself, synchronously, as epoch `epoch`'s checkpoint (the caller has
        flushed the writer before writing it)."""
        done: Future[SavedCheckpoint] = Future()
        t = self.trainer
        done.set_result(SavedCheckpoint(self._stage(epoch), weights_digest(t.ema.ema, as_saved=True), 0.0))
        with self._lock:
            self._saves[epoch] = done

    def close(self) -> None:
        """Finish the pending saves and stop the writer process."""
        if self._proc is None:
            return
        if self._proc.is_alive():
            self._requests.put(None)
            self._proc.join(60)
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()

    # ------------------------------------------------------------------ the writer process

    def _start(self) -> None:
        """Fork the writer process with a CPU copy of the EMA module in it (deep-copying the module tree is the
        costly part of a save: once per run here) and a thread here that collects its replies."""
        self._shadow = _cpu_module(self.trainer.ema.ema)
        ctx = multiprocessing.get_context("fork")  # the child inherits the module and the trainer's settings
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(target=self._serve, args=(os.getpid(),), name="yolo_ray-ckpt", daemon=True)
        self._proc.start()
        threading.Thread(target=self._collect, name="yolo_ray-ckpt-replies", daemon=True).start()

    def _serve(self, parent: int) -> None:
        """The writer process: write each snapshot in turn until told to stop or the training process is gone."""
        torch.set_num_threads(1)  # CPU work on small tensors; and a forked OpenMP pool is not to be trusted
        while True:
            try:
                job = self._requests.get(timeout=PARENT_CHECK_S)
            except queue.Empty:
                if os.getppid() != parent:
                    return
                continue
            if job is None:
                return
            keys, ema_host, frozen = job
            try:
                reply: tuple = (frozen["epoch"], self._write(dict(zip(keys, ema_host.tensors(), strict=True)), frozen))
            except BaseException:
                reply = (frozen["epoch"], RuntimeError(f"checkpoint writer:\n{traceback.format_exc()}"))
            del job, ema_host, frozen  # drop the shared buffers before the next snapshot arrives
            self._replies.put(reply)

    def _collect(self) -> None:
        """Resolve each epoch's future from the writer's replies; fail the pending ones if the process dies."""
        proc = self._proc
        assert proc is not None
        while True:
            try:
                epoch, result = self._replies.get(timeout=1.0)
            except queue.Empty:
                if proc.is_alive():
                    continue
                with self._lock:
                    pending = [f for f in self._saves.values() if not f.done()]
                for f in pending:
                    f.set_exception(RuntimeError(f"the checkpoint writer process exited (code {proc.exitcode})"))
                return
            with self._lock:
                future = self._saves.get(epoch)
            if future is None or future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _write(self, state: dict[str, torch.Tensor], frozen: dict) -> SavedCheckpoint:
        """In the writer process: Ultralytics' save_model on a frozen view of the trainer, then the renames."""
        started = time.perf_counter()
        shadow = self._shadow
        assert shadow is not None
        shadow.load_state_dict(state)  # copies into the shadow's own tensors
        for k, v in frozen["ema_attrs"].items():
            setattr(shadow, k, v)
        t = self.trainer
        last, best = t.last, t.best
        optimizer = frozen["optimizer"]
        view = _Frozen(
            t,
            ema=SimpleNamespace(ema=shadow, updates=frozen["ema_updates"]),
            optimizer=SimpleNamespace(state_dict=lambda: optimizer_state(optimizer)),
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
        directory = self._stage(frozen["epoch"], view.last)
        os.replace(view.last, last)  # a rename: the staged link keeps this epoch's bytes whatever comes next
        if view.best.exists():
            os.replace(view.best, best)
        digest = weights_digest(shadow, as_saved=True)
        return SavedCheckpoint(directory, digest, time.perf_counter() - started)

    def _stage(self, epoch: int, written: Path | None = None) -> Path:
        """A staging directory holding a hard link to epoch `epoch`'s last.pt (a copy where links are refused)."""
        directory = self.staging_dir(epoch)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        source = written or self.trainer.last
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


def _on_cpu(value: Any) -> Any:
    """A copy of an EMA attribute for the writer process: tensors on the CPU (it must never touch a GPU)."""
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def _cpu_module(module: nn.Module) -> nn.Module:
    """A CPU copy of the EMA module with nothing on a GPU: parameters and buffers (and, through Ultralytics' own
    `_apply`, the Detect head's anchors and strides) moved; the loss criterion, which Ultralytics strips from every
    checkpoint anyway, dropped; any other tensor attribute moved too."""
    criterion = getattr(module, "criterion", None)
    if criterion is not None:
        module.criterion = None  # not deep-copied: it holds GPU tensors and is not saved
    try:
        shadow = copy.deepcopy(module).to("cpu")
    finally:
        if criterion is not None:
            module.criterion = criterion
    for m in shadow.modules():
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                setattr(m, k, v.cpu())
    return shadow


def host_copies(tensors: list[torch.Tensor]) -> tuple[HostTensors, bool]:
    """Host copies of `tensors` in shared memory, made with one concatenation and one transfer per (device, dtype)
    instead of one sync per tensor; also whether every floating-point value is finite."""
    flats: list[torch.Tensor] = []
    where: list[tuple[int, int, torch.Size] | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, x in enumerate(tensors):
        groups.setdefault((x.device, x.dtype), []).append(i)
    finite = True
    for (_, dtype), idx in groups.items():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])  # reshape: logical order, any layout
        if dtype.is_floating_point:
            finite = finite and bool(torch.isfinite(flat).all())
        host = torch.empty(flat.shape, dtype=dtype).share_memory_()
        host.copy_(flat)
        offset = 0
        for i in idx:
            where[i] = (len(flats), offset, tensors[i].shape)
            offset += tensors[i].numel()
        flats.append(host)
    return HostTensors(flats, where), finite  # type: ignore[arg-type]


def optimizer_snapshot(state_dict: dict) -> dict:
    """An optimizer state_dict with its state tensors copied to the host (as HostTensors: see host_copies)."""
    slots = [(p, k) for p, s in state_dict["state"].items() for k, v in s.items() if isinstance(v, torch.Tensor)]
    copies, _ = host_copies([state_dict["state"][p][k] for p, k in slots])
    skeleton = {
        p: {k: v for k, v in s.items() if not isinstance(v, torch.Tensor)} for p, s in state_dict["state"].items()
    }
    return {
        "state": skeleton,
        "slots": slots,
        "tensors": copies,
        "param_groups": copy.deepcopy(state_dict["param_groups"]),
    }


def optimizer_state(snapshot: dict) -> dict:
    """The state_dict an optimizer_snapshot was taken of, each tensor in storage of its own (a view would pickle
    its whole buffer)."""
    state = {p: dict(s) for p, s in snapshot["state"].items()}
    for (p, k), v in zip(snapshot["slots"], snapshot["tensors"].tensors(), strict=True):
        state[p][k] = v.clone()
    return {"state": state, "param_groups": snapshot["param_groups"]}


def weights_digest(module: nn.Module, as_saved: bool = False) -> str:
    """SHA-256 of a module's parameters (names and values, in order); as_saved: rounded to fp16 as last.pt stores
    them. One device-to-host copy of all of them, not one sync per tensor: it runs every epoch."""
    names, tensors = zip(*module.named_parameters(), strict=True)
    flat = torch.cat([p.detach().reshape(-1).float() for p in tensors])
    flat = flat.half() if as_saved else flat  # fp16 bytes: half the hashing, which costs ~0.1 s on YOLO11m in fp32
    h = hashlib.sha256("\n".join(names).encode())
    h.update(flat.cpu().numpy().tobytes())
    return h.hexdigest()

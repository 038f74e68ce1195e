"""Validation off the training GPUs' critical path (`train.val_async: true`).

Inline, Ultralytics stops every rank at each epoch's end while the validator runs (its val loader, the forward pass,
NMS on a young model's many boxes). Here rank 0 hands the epoch's EMA weights to a validator and every rank goes on
training. The validator keeps one Ultralytics task trainer, its validator and its val loader (the val images decoded
once, in RAM) for the whole run, and calls that validator in its training mode exactly as the trainer does inline:
the same metrics, fitness and val losses for the same weights. Where it runs (`train.val_runner`):
- `thread` (the default): a thread of rank 0's training process, its GPU work on a CUDA stream of its own (one
  process: kernels of both streams run side by side); the weights are copied on the device.
- `actor`: a Ray actor on resources of its own (`train.val_gpus` / `train.val_cpus`: a spare GPU, a share of one, or
  CPUs); the weights travel as a host copy through Ray's object store. Its own process: a crash there is not
  training's. Two processes on one GPU take turns on it (time-slicing), which slows both: it is for spare resources.

Rank 0 applies the results in epoch order, as Ultralytics would have applied them at their epoch: best fitness,
early stopping (`patience`), the epoch's results.csv row and its history.jsonl line, and best.pt (the epoch's last.pt,
kept as a hard link in `.yolo_ray_val_epoch<k>/` until its result is in). The lag is bounded: at the end of epoch k
rank 0 waits for epoch k-2's result, so a decision on epoch k's mAP is taken by the end of epoch k+2 at the latest;
the last epoch (or an early stop) waits for every result before final_eval.

A validation that fails (an exception, or the actor's process dying) is submitted again, up to VAL_ATTEMPTS times;
then the epoch's line says `val_failed` and training goes on. After a restart, epochs whose result never came back are
validated again from their kept last.pt.

Why not Ray Train's ValidationConfig: its results reach the controller, while best.pt, patience and the metrics each
report carries live in the worker loop; and a task per checkpoint would build the val loader again every epoch.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import math
import os
import shutil
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from torch import nn

from yolo_ray.console import say
from yolo_ray.worker import val_batches
from yolo_ray.worker.checkpoint_writer import AWAITING_PREFIX, awaiting_dir, host_copies
from yolo_ray.worker.val_graphs import EvalGraphs
from yolo_ray.worker_plan import ValAsyncSettings

VAL_ATTEMPTS = 3  # submissions of one epoch's validation before it is given up
MAX_LAG = 2  # epochs of training a validation may run behind


def awaiting_epochs(weights_dir: Path) -> list[int]:
    """Epochs (0-based, Ultralytics' trainer.epoch) whose kept last.pt still waits for its validation."""
    out = []
    for d in weights_dir.glob(f"{AWAITING_PREFIX}*"):
        suffix = d.name[len(AWAITING_PREFIX) :]
        if suffix.isdigit() and (d / "last.pt").exists():
            out.append(int(suffix))
    return sorted(out)


class Validator:
    """One Ultralytics task trainer (never trained) lending its validator, val loader and loss names. Runs as a Ray
    actor of its own (`train.val_runner: actor`), or in rank 0's training process (`thread`: built there, called on
    a thread of its own, its GPU work on a CUDA stream of its own)."""

    def __init__(self, overrides: dict, model: nn.Module, batch: int, workers: int | None, fault: dict,
                 device: str | None = None, cuda_graphs: bool = False):  # fmt: skip
        """device: the training device when built in the training process; None in an actor (Ray's GPU, if any);
        cuda_graphs: the forward replayed as CUDA graphs on a GPU (train.val_cuda_graphs; the weights are loaded
        into the same tensors every epoch, so the graphs read each epoch's)."""
        from yolo_ray import tasks, ultralytics_env

        self.in_process = device is not None
        if not self.in_process:
            ultralytics_env.set_offline_env(verbose=False)
            ultralytics_env.disable_integrations()
            ultralytics_env.quiet_progress_bars()
        self.device = torch.device(device or ("cuda:0" if ray.get_gpu_ids() else "cpu"))
        here = Path(overrides["save_dir"]) / "val_async"  # its own args.yaml and weights dir, never the run's
        settings = {
            **{k: v for k, v in overrides.items() if k != "resume"},
            "device": "cpu" if self.device.type == "cpu" else str(self.device.index or 0),
            "save_dir": str(here),
            "plots": False,  # final_eval draws the plots from best.pt, as inline
            "cache": "ram",  # the val images decoded and resized once for the whole run
            **({"workers": workers} if workers is not None else {}),
        }
        with _process_state_kept(self.in_process):
            trainer = tasks.trainer_base(overrides["task"])(overrides=settings)
        trainer.model = model.to(self.device).float()
        trainer.set_model_attributes()  # nc, names, args: the loss reads its gains from model.args
        split = trainer.data.get("val") or trainer.data.get("test")
        val_batch = batch if trainer.args.task == "obb" else batch * 2  # the trainer's own test loader batch
        trainer.test_loader = val_batches.on_device(trainer.get_dataloader(split, val_batch, -1, "val"), self.device)
        from yolo_ray.worker import batched_val  # imports Ultralytics: after the environment above is set

        self.validator = batched_val.batched(trainer.get_validator())
        trainer.amp = self.device.type == "cuda" and bool(trainer.args.amp)
        trainer.device = self.device
        trainer.world_size = 1
        trainer.ema = type("EMA", (), {"ema": trainer.model})()
        trainer.stopper = type("Stopper", (), {"possible_stop": False})()
        self.trainer = trainer
        self.stream = torch.cuda.Stream(self.device) if self.in_process and self.device.type == "cuda" else None
        self.graphs = EvalGraphs() if cuda_graphs and self.device.type == "cuda" else None
        self.fault_epoch = fault.get("epoch")
        self.fault_marker = here / ".fault_done"

    def validate(self, epoch: int, state: dict[str, torch.Tensor] | str, loss_shapes: dict,
                 ready: torch.cuda.Event | None = None) -> dict[str, Any]:  # fmt: skip
        """Epoch `epoch`'s metrics, fitness and timing for these EMA weights (a state dict, or a kept last.pt);
        loss_shapes: the training loss items' (the val losses are summed into tensors of their shapes); ready: the
        training stream's event after which `state` (copies on the training device) may be read."""
        self._maybe_fail(epoch)
        started = time.perf_counter()
        from yolo_ray.worker.trainer import undistributed_validation  # no collective: only rank 0 validates

        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            if ready is not None and self.stream is not None:
                self.stream.wait_event(ready)
            if isinstance(state, str):  # after a restart: the epoch's kept last.pt (fp16 EMA, as best.pt is)
                state = torch.load(state, map_location="cpu", weights_only=False)["ema"].float().state_dict()
            elif self.stream is not None:
                for v in state.values():
                    v.record_stream(self.stream)  # made on the training stream, read on this one
            t = self.trainer
            t.model.load_state_dict(state)
            t.epoch, t.epochs = epoch, epoch + 2  # not the last epoch: no plots
            t.loss_items = {k: torch.zeros(shape, device=self.device) for k, shape in loss_shapes.items()}
            graphs = self.graphs.installed(t.model) if self.graphs is not None else contextlib.nullcontext()
            with undistributed_validation() if self.in_process else contextlib.nullcontext(), graphs:
                metrics = self.validator(trainer=t)
        fitness = metrics.pop("fitness", None)
        return {
            "epoch": epoch,
            "metrics": metrics,
            "fitness": None if fitness is None else float(fitness),
            "val_s": time.perf_counter() - started,
            "speed": dict(self.validator.speed),
        }

    def _maybe_fail(self, epoch: int) -> None:
        """Fault injection (run.fail_val_at_epoch), once: an actor's process dies (Ray restarts it), a thread raises."""
        if epoch != self.fault_epoch or self.fault_marker.exists():
            return
        self.fault_marker.parent.mkdir(parents=True, exist_ok=True)
        self.fault_marker.touch()
        if self.in_process:
            raise RuntimeError(f"yolo_ray fault injection: validation of epoch {epoch + 1} fails")
        os._exit(1)


@contextlib.contextmanager
def _process_state_kept(in_process: bool) -> Iterator[None]:
    """Building an Ultralytics trainer in the training process must leave that process as it was: the trainer's
    init reseeds every random generator (the training's own streams), points CUDA_VISIBLE_DEVICES at its device, and
    holds a barrier for all ranks around its dataset check (only rank 0 builds this one)."""
    if not in_process:
        yield
        return
    import random

    import numpy as np
    import ultralytics.engine.trainer as engine

    rngs = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    visible, local_rank = os.environ.get("CUDA_VISIBLE_DEVICES"), engine.LOCAL_RANK
    engine.LOCAL_RANK = -1
    try:
        yield
    finally:
        engine.LOCAL_RANK = local_rank
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        random.setstate(rngs[0])
        np.random.set_state(rngs[1])
        torch.set_rng_state(rngs[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@dataclass
class Result:
    epoch: int
    metrics: dict[str, float] | None  # Ultralytics' keys; None: every attempt failed
    fitness: float | None
    val_s: float
    is_best: bool
    speed: dict[str, float]
    applied_at: int  # the epoch (0-based) at whose end it was applied: the lag is applied_at - epoch
    from_kept: bool  # validated after a restart from the epoch's kept last.pt (fp16 weights, as best.pt holds)

    def line(self) -> dict[str, Any]:
        """The epoch's validation half of its history.jsonl line (the keys inline validation puts there)."""
        from yolo_ray.metrics import clean

        if self.metrics is None:
            return {"val_failed": 1.0}
        return {
            **clean(self.metrics),
            "fitness": float(self.fitness or 0.0),
            "val_s": self.val_s,
            **{f"val_ms_per_image/{k}": float(v) for k, v in self.speed.items()},
            "val_lag_epochs": self.applied_at - self.epoch,
            **({"val_from_kept_checkpoint": 1.0} if self.from_kept else {}),
        }


class AsyncValidation:
    """Rank 0's side: submits each epoch, applies the results in order, promotes best.pt, keeps the lag bounded."""

    def __init__(self, trainer: Any, settings: ValAsyncSettings, on_result: Any, revalidate: list[int]):
        """on_result(Result): the epoch reporter's hook (the epoch's history line waits for it); revalidate: epochs
        (0-based) of an earlier attempt whose result never came, validated first from their kept last.pt."""
        self.trainer, self.settings, self.on_result, self.revalidate = trainer, settings, on_result, revalidate
        self.actor: Any = None  # runner `actor`: the Ray actor, and what it is made from
        self.actor_args: tuple = ()
        self.local: Validator | None = None  # runner `thread`: the validator in this process, and its thread
        self.pool: futures.ThreadPoolExecutor | None = None
        # epoch -> (ObjectRef or Future of its result, attempts so far, the actor it went to)
        self.pending: dict[int, tuple[Any, int, Any]] = {}
        self.sources: dict[int, Any] = {}  # epoch -> what was validated (the state's ref or copy, or a kept path)
        self.results: dict[int, Result] = {}
        self.latest: Result | None = None
        self.next_epoch: int | None = None  # the next epoch whose result is applied (results are applied in order)

    @property
    def weights_dir(self) -> Path:
        return Path(self.trainer.wdir)

    def start(self) -> None:
        """Start the validator (at the start of training: its start-up overlaps the first epoch)."""
        t = self.trainer
        overrides = {**vars(t.args), "task": t.args.task, "save_dir": str(t.save_dir)}
        per_worker = t.batch_size // max(t.world_size, 1)
        fault = {"epoch": self.settings.fail_at_epoch}
        graphs = self.settings.cuda_graphs
        model = copy.deepcopy(t.ema.ema).float()
        model.criterion = None  # training-only state (an actor could not unpickle its device tensors); rebuilt lazily
        if self.settings.runner == "thread":
            self.local = Validator(overrides, model, per_worker, None, fault, device=str(t.device), cuda_graphs=graphs)
            self.pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="yolo_ray-val")
            return
        # the actor is made again from these if its process dies: rank 0 keeps them (and the model in Ray's store)
        workers = max(1, int(self.settings.cpus) // 2)  # Ultralytics doubles it for a val loader: one per CPU
        self.actor_args = (overrides, ray.put(model.to("cpu")), per_worker, workers, fault, None, graphs)
        self._start_actor()

    def _start_actor(self) -> None:
        cls = ray.remote(Validator).options(
            num_cpus=self.settings.cpus,
            num_gpus=self.settings.gpus,
            max_restarts=0,  # a dead one is replaced by rank 0 (below), which counts each epoch's attempts
            scheduling_strategy="DEFAULT",  # never inside the training group's placement group
        )
        self.actor = cls.remote(*self.actor_args)

    def epoch_end(self) -> tuple[dict, None]:
        """Ultralytics' validate() at the end of an epoch: submit this epoch, apply what is in (waiting for what is
        more than MAX_LAG behind, or for everything on the last epoch), and return this epoch's metrics when its
        result is already applied, else NaN for each key (results.csv's row is completed when it comes)."""
        t = self.trainer
        if self.actor is None and self.local is None:
            self.start()
        if self.next_epoch is None:  # the first epoch of this attempt: an earlier attempt's epochs go first
            for kept in self.revalidate:
                self._submit(kept, str(awaiting_dir(self.weights_dir, kept) / "last.pt"))
            self.next_epoch = self.revalidate[0] if self.revalidate else t.epoch
        epoch = t.epoch
        self._submit(epoch, self._snapshot())
        self._apply_ready(wait_through=epoch - MAX_LAG)
        if t.stop or epoch + 1 >= t.epochs:
            self.drain()
        done = self.results.get(epoch)
        if done is not None and done.metrics is not None:
            return dict(done.metrics), None
        return {k: math.nan for k in t.metrics or {}}, None

    def drain(self) -> None:
        """Wait for and apply every submitted validation."""
        if self.pending:
            self._apply_ready(wait_through=max(self.pending))

    def _snapshot(self) -> Any:
        """The EMA's weights now: copies on the training device and the event after which they may be read (the
        thread), or a host copy in Ray's object store (the actor)."""
        ema = self.trainer.ema.ema
        if self.local is not None:
            state = {k: v.detach().clone() for k, v in ema.state_dict().items()}
            ready = None
            if self.local.stream is not None:
                ready = torch.cuda.Event()
                ready.record()
            return state, ready
        return ray.put(_host_state(ema))

    def _submit(self, epoch: int, source: Any, attempts: int = 0) -> None:
        self.sources[epoch] = source
        shapes = {k: tuple(v.shape) for k, v in self.trainer.loss_items.items()}
        if self.pool is not None:  # the thread runner (self.local beside it)
            assert self.local is not None
            state, ready = source if isinstance(source, tuple) else (source, None)
            handle = self.pool.submit(self.local.validate, epoch, state, shapes, ready)
        else:
            handle = self.actor.validate.remote(epoch, source, shapes)
        self.pending[epoch] = (handle, attempts + 1, self.actor)

    def _apply_ready(self, wait_through: int) -> None:
        """Apply results in epoch order: those already in, and (waiting) every one up to `wait_through`."""
        while self.next_epoch in self.pending:
            epoch = self.next_epoch
            handle, attempts, actor = self.pending[epoch]
            if epoch > wait_through and not _done(handle):
                return  # not in yet and not due: training goes on
            try:
                out = handle.result() if isinstance(handle, futures.Future) else ray.get(handle)
            except Exception as e:  # the validator's error, or its process gone (an actor's)
                if isinstance(e, ray.exceptions.RayActorError) and actor is self.actor:
                    ray.kill(actor)  # gone or going: a new one takes this and the later epochs
                    self._start_actor()
                if attempts < VAL_ATTEMPTS:
                    say(f"[yolo_ray] validation of epoch {epoch + 1} failed ({type(e).__name__}): submitting it again")
                    self._submit(epoch, self.sources[epoch], attempts)
                    continue
                say(f"[yolo_ray] validation of epoch {epoch + 1} failed {attempts} times: training goes on without it")
                out = {"metrics": None, "fitness": None, "val_s": 0.0, "speed": {}}
            del self.pending[epoch]
            self._apply(epoch, out, from_kept=isinstance(self.sources.pop(epoch, None), str))
            self.next_epoch = epoch + 1

    def _apply(self, epoch: int, out: dict, from_kept: bool) -> None:
        """One epoch's result, as Ultralytics applies an inline one at that epoch."""
        t = self.trainer
        fitness = out["fitness"]
        is_best = fitness is not None and (t.best_fitness is None or fitness > t.best_fitness)
        if is_best:
            t.best_fitness = fitness
        if fitness is not None and t.stopper(epoch + 1, fitness):
            t.stop = True
        result = Result(epoch, out["metrics"], fitness, out["val_s"], is_best, out["speed"], t.epoch, from_kept)
        self.results[epoch] = result
        if out["metrics"] is not None:
            self.latest = result
            _complete_csv_row(t.csv, epoch + 1, out["metrics"])
        self.on_result(result)

    def promote(self, epoch: int) -> None:
        """The reporter wrote epoch `epoch`'s line: its kept last.pt becomes best.pt if it is the best so far."""
        kept = awaiting_dir(self.weights_dir, epoch)
        result = self.results.get(epoch)
        if result is not None and result.is_best and (kept / "last.pt").exists():
            # a name of its own: the writer thread clears its `.best.pt.partial` at every save
            staged = self.trainer.best.with_name(f".{self.trainer.best.name}.promoting")
            staged.unlink(missing_ok=True)
            os.link(kept / "last.pt", staged)
            os.replace(staged, self.trainer.best)  # a rename: a reader sees the old best.pt or the new one
        shutil.rmtree(kept, ignore_errors=True)

    def close(self) -> None:
        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None


def _done(handle: Any) -> bool:
    if isinstance(handle, futures.Future):
        return handle.done()
    ready, _ = ray.wait([handle], timeout=0)
    return bool(ready)


def _host_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict on the host, each tensor in storage of its own (one transfer per dtype)."""
    keys, values = zip(*module.state_dict().items(), strict=True)
    copies, _ = host_copies(list(values))
    return {k: v.clone() for k, v in zip(keys, copies, strict=True)}


def _complete_csv_row(csv_path: Path, epoch: int, metrics: dict[str, float]) -> None:
    """Fill epoch `epoch`'s validation columns of Ultralytics' results.csv (written with NaN at the epoch's end)."""
    if not Path(csv_path).exists():
        return
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    header = [h.strip() for h in rows[0]]
    for row in rows[1:]:
        if row and int(float(row[0])) == epoch:
            for k, v in metrics.items():
                if k in header:
                    row[header.index(k)] = f"{v:.6g}"
    tmp = Path(csv_path).with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        f.write("".join(",".join(r) + "\n" for r in rows))
    os.replace(tmp, csv_path)

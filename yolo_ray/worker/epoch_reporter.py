"""What a worker reports at each epoch's end: the epoch's metrics to Ray Train (with its checkpoint, written off the
training thread and handed over asynchronously), and history.jsonl's line, written in epoch order once the
checkpoint is on storage and, with train.val_async, its validation result is in."""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import ray.train
import torch.distributed as dist

from yolo_ray import faults
from yolo_ray.metrics import epoch_metrics
from yolo_ray.summary import append_history
from yolo_ray.worker import async_val
from yolo_ray.worker.async_val import AsyncValidation
from yolo_ray.worker_plan import ValAsyncSettings


class HistoryLines:
    """history.jsonl's lines, in epoch order, each written once both its halves are in: the epoch's training row
    (once its checkpoint is on storage) and, with train.val_async, its validation result."""

    def __init__(self, run_dir: Path, first_epoch: int, needs_val: bool, on_written: Any = None):
        """first_epoch: 1-based, the first line this attempt writes; on_written(epoch, 0-based) after each."""
        self.run_dir, self.next, self.needs_val, self.on_written = run_dir, first_epoch, needs_val, on_written
        self.rows: dict[int, dict] = {}
        self.vals: dict[int, dict] = {}
        self.lock = threading.Lock()

    def row(self, epoch: int, row: dict) -> None:
        with self.lock:
            self.rows[epoch] = row
            self._flush()

    def val(self, epoch: int, part: dict) -> None:
        with self.lock:
            self.vals[epoch] = part
            self._flush()

    def _flush(self) -> None:
        while self.next in self.rows and (self.next in self.vals or not self.needs_val):
            epoch = self.next
            append_history(self.run_dir, {**_finite(self.rows.pop(epoch)), **self.vals.pop(epoch, {})})
            if self.on_written is not None:
                self.on_written(epoch - 1)
            self.next += 1


class EpochReporter:
    """Ultralytics callbacks that time each epoch and hand metrics plus a checkpoint to Ray Train.

    Rank 0's checkpoint is written by the trainer's writer thread; Ray persists it through its asynchronous upload
    (a thread of Ray's that waits for the file, copies it to storage, then registers it), so the training thread
    goes on to the next epoch at once. history.jsonl still gets an epoch's line only after its checkpoint is on
    storage."""

    def __init__(self, trainer: Any, run_dir: Path, resumed_from: int | None, fault: faults.FaultPlan):
        self.trainer, self.run_dir, self.resumed_from, self.fault = trainer, run_dir, resumed_from, fault
        self.rank = ray.train.get_context().get_world_rank()
        self.t_epoch = self.t_train_end = 0.0
        self.batches = 0  # of this epoch (mid-epoch fault injection)
        self.start_digest = ""
        self.persisting: dict[int, threading.Event] = {}  # epoch -> set once its checkpoint is on storage
        self.lines = HistoryLines(run_dir, (resumed_from or 0) + 1, needs_val=False)

    def validate_async(self, settings: ValAsyncSettings, revalidate: list[int]) -> None:
        """Rank 0 with train.val_async: each epoch's line also waits for its validation result; the epochs of an
        earlier attempt that never got theirs are validated again first (their training rows were kept)."""
        t = self.trainer
        t.async_val = AsyncValidation(t, settings, lambda r: self.lines.val(r.epoch + 1, r.line()), revalidate)
        first = revalidate[0] + 1 if revalidate else (self.resumed_from or 0) + 1
        self.lines = HistoryLines(self.run_dir, first, needs_val=True, on_written=t.async_val.promote)
        for epoch in revalidate:
            row = json.loads((async_val.awaiting_dir(Path(t.wdir), epoch) / "row.json").read_text())
            self.lines.row(epoch + 1, row)

    def attach(self) -> None:
        self.trainer.add_callback("on_train_start", self.on_train_start)
        self.trainer.add_callback("on_train_epoch_start", self.on_train_epoch_start)
        self.trainer.add_callback("on_train_epoch_end", self.on_train_epoch_end)
        if self.fault.batch is not None:
            self.trainer.add_callback("on_train_batch_end", self.on_train_batch_end)
        self.trainer.add_callback("on_fit_epoch_end", self.on_fit_epoch_end)

    def on_train_start(self, trainer: Any) -> None:
        if self.rank == 0:  # the weights this attempt starts from (a resumed one: the checkpoint's)
            self.start_digest = trainer.parameter_digest(as_saved=True)
        if trainer.async_val is not None:  # the validator starts while the first epoch trains
            trainer.async_val.start()

    def on_train_epoch_start(self, trainer: Any) -> None:
        epoch = trainer.epoch + 1
        if self.fault.due(epoch_about_to_start=epoch, resumed_from=self.resumed_from):
            self.drain()  # the planned failure comes after the previous epoch's checkpoint is on storage
            barrier()
        self.fault.maybe_fail(rank=self.rank, epoch_about_to_start=epoch, resumed_from=self.resumed_from)
        self.t_epoch = time.perf_counter()
        self.batches = 0

    def on_train_batch_end(self, trainer: Any) -> None:
        self.batches += 1
        self.fault.maybe_fail(self.rank, trainer.epoch + 1, self.resumed_from, batches_done=self.batches)

    def on_train_epoch_end(self, trainer: Any) -> None:
        self.t_train_end = time.perf_counter()

    def on_fit_epoch_end(self, trainer: Any) -> None:
        if trainer.in_final_eval:
            return
        t_fit_end = time.perf_counter()
        row = reported = None
        if self.rank == 0:
            row = epoch_metrics(trainer, self.t_train_end - self.t_epoch, self.resumed_from)
            row["save_s"] = t_fit_end - self.t_train_end  # Ultralytics' end of epoch: validation, CSV, snapshot
            row["start_weights_sha256"] = self.start_digest  # the driver prints the epoch from history.jsonl
            row["time"] = time.time()  # the epoch's end (its line is written later, once persisted)
            reported = {**_finite(row), **self._latest_validation()}
        reported = broadcast(reported)
        if self.rank == 0 and trainer.writer.has(trainer.epoch):
            self._report_with_checkpoint(trainer.epoch, row, reported, t_fit_end)
        else:
            ray.train.report(reported)
            if self.rank == 0:  # an epoch without a checkpoint (train.extra.save=false): its line after the others
                self.drain()
                self.lines.row(row["epoch"], {**row, "report_s": time.perf_counter() - t_fit_end})
        if self.rank == 0 and trainer.async_val is not None and (trainer.stop or trainer.epoch + 1 >= trainer.epochs):
            self.drain()  # the last line (and best.pt, promoted with it) before final_eval reads best.pt

    def _latest_validation(self) -> dict[str, Any]:
        """With train.val_async, what a report carries: the latest validated epoch's metrics (Tune and ASHA judge
        on them) and that epoch's number; nothing before the first result."""
        av = self.trainer.async_val
        if av is None:
            return {}
        if av.latest is None:
            return {"val_epoch": 0}
        return {**av.latest.line(), "val_epoch": av.latest.epoch + 1}

    def _report_with_checkpoint(self, epoch: int, metrics: dict, reported: dict, t_fit_end: float) -> None:
        """metrics: the epoch's own row (its history line); reported: what Ray Train gets (with val_async the
        latest validation's metrics too)."""
        writer = self.trainer.writer
        storage = ray.train.get_context().get_storage()
        report_s: futures.Future[float] = futures.Future()  # the hand-off time, set once report() returns
        persisted = self.persisting[epoch] = threading.Event()

        def persist(_: ray.train.Checkpoint, dir_name: str) -> ray.train.Checkpoint:
            """On Ray's upload thread: wait for the writer, add meta.json, copy to storage, log the epoch."""
            try:
                t0 = time.perf_counter()
                saved = writer.saved(epoch)
                row = {**metrics, "saved_weights_sha256": saved.weights_sha256, "checkpoint_write_s": saved.write_s}
                meta = {"epoch": metrics["epoch"], "last_pt_bytes": (saved.directory / "last.pt").stat().st_size}
                (saved.directory / "meta.json").write_text(json.dumps({**meta, "metrics": row}))
                kept = async_val.awaiting_dir(saved.directory.parent, epoch)
                if self.trainer.async_val is not None and kept.exists():  # its line waits for the validation
                    (kept / "row.json").write_text(json.dumps(row, allow_nan=True))
                stored = storage.persist_current_checkpoint(
                    ray.train.Checkpoint.from_directory(saved.directory), dir_name
                )
                writer.release(epoch)
                # report_s: the training thread's share (metrics, checkpoint hand-off); persist_s: this thread's
                try:
                    handed_off = report_s.result(timeout=60)
                except futures.TimeoutError:  # the builtin TimeoutError only from Python 3.11
                    handed_off = None
                self.lines.row(row["epoch"], {**row, "report_s": handed_off, "persist_s": time.perf_counter() - t0})
                return stored
            finally:
                persisted.set()

        ray.train.report(
            reported,
            checkpoint=ray.train.Checkpoint.from_directory(writer.staging_dir(epoch)),
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
            checkpoint_upload_fn=persist,
            delete_local_checkpoint_after_upload=False,  # the writer's staging: released in persist
        )
        report_s.set_result(time.perf_counter() - t_fit_end)

    def drain(self, timeout: float = 300) -> None:
        """Wait until every checkpoint handed to Ray is on storage."""
        for done in self.persisting.values():
            done.wait(timeout)


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """The row without NaN values (an epoch whose validation has not come back yet, train.val_async)."""
    return {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank (so every rank reports the same metrics)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]

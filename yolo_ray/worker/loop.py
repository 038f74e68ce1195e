"""The Ray Train worker: where ranks and devices are decided and each epoch is reported.

Runs once per Ray worker process. Ray has already set RANK / LOCAL_RANK / WORLD_SIZE / NODE_RANK and created the
process group; this function imports Ultralytics only now, so Ultralytics sees those ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import ray.train
import torch
import torch.distributed as dist

from yolo_ray import run_layout as layout
from yolo_ray import user_callbacks
from yolo_ray.console import say
from yolo_ray.metrics import final_metrics, final_record
from yolo_ray.progress import ProgressWriter
from yolo_ray.summary import newest_checkpoint, read_history, write_history
from yolo_ray.worker import async_val
from yolo_ray.worker.checkpoint_writer import STAGING_PREFIX
from yolo_ray.worker.epoch_reporter import EpochReporter, broadcast
from yolo_ray.worker_plan import WorkerPlan


def train_loop_per_worker(config: dict[str, WorkerPlan]) -> None:
    """config: {"plan": the driver's WorkerPlan} (launcher.plan_workers)."""
    plan = config["plan"]
    ctx, device = _set_up_process(plan)
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    run_dir = Path(plan.run_dir)
    overrides = dict(plan.overrides)
    overrides["device"] = "cpu" if device.type == "cpu" else str(device.index)
    overrides.update(plan.batch.ultralytics(world_size))  # this start's group size (elastic groups resize)
    with ExitStack() as stack:
        ckpt_dir, resumed_from, revalidate = _resume(plan, run_dir, rank, stack)
        if resumed_from is not None and resumed_from >= overrides["epochs"]:
            # every epoch trained and saved, but the run stopped before its end (a driver killed after the last
            # checkpoint): Ultralytics refuses to resume a finished schedule, so do what is left of it
            finish_trained_run(plan, run_dir, overrides, resumed_from, rank)
            return
        if ckpt_dir is not None:
            overrides["resume"] = str(Path(ckpt_dir) / "last.pt")
            if rank == 0:
                say(f"[yolo_ray] resuming from the epoch-{resumed_from} checkpoint {ckpt_dir}")
        trainer = _trainer(plan, overrides, device, world_size)
        stack.callback(trainer.writer.close)  # on the way out: final_eval flushed the saves (or drain() waited)
        reporter = _attach(plan, trainer, run_dir, rank, resumed_from, revalidate, stack)
        try:
            trainer.train()
        except BaseException:
            reporter.drain()  # an epoch that ended before the failure keeps its checkpoint
            raise
        write_rank_record(trainer, run_dir, ctx, device, resumed_from)
        if rank == 0:
            (run_dir / layout.FINAL_METRICS).write_text(json.dumps(final_metrics(trainer), indent=2))
            if plan.export and trainer.best.exists():
                export_best(trainer.best, Path(overrides["data"]), trainer.args.imgsz, run_dir)


def _set_up_process(plan: WorkerPlan) -> tuple[Any, torch.device]:
    """This worker's Ray Train context and its device; Ultralytics offline, quiet and without its integrations."""
    from yolo_ray import ultralytics_env

    ultralytics_env.set_offline_env(verbose=plan.verbose)
    if not plan.verbose:
        # DDP compares a gradient's strides with its bucket's, size-1 dimensions included: a depthwise conv's
        # [C, 1, 3, 3] weight whose gradient comes back channels-last (the device loader's images are) is the same
        # memory order, and DDP warns once per rank that it is not
        warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    device = ray.train.torch.get_device()
    if isinstance(device, list):  # several GPUs per worker: DDP still drives one
        device = device[0]
    ultralytics_env.disable_integrations()
    ultralytics_env.quiet_progress_bars()
    return ray.train.get_context(), device


def _resume(plan: WorkerPlan, run_dir: Path, rank: int, stack: ExitStack) -> tuple[str | None, int | None, list[int]]:
    """(checkpoint directory, its epoch, epochs to validate again): the newest complete checkpoint, the same on every
    rank; rank 0 tidies what a killed attempt left (staging directories, history lines past the checkpoint)."""
    if rank == 0:
        remove_stale_staging(layout.weights(run_dir))
    ckpt_dir, resumed_from = broadcast(resume_point(run_dir, stack))
    revalidate = []  # epochs (0-based) trained and saved whose validation result never came back
    if rank == 0 and plan.val_async is not None:
        revalidate = unvalidated_epochs(run_dir, resumed_from or 0)
    if ckpt_dir is not None and rank == 0:
        reconcile_history(run_dir, Path(ckpt_dir), awaiting=set(revalidate))
    return ckpt_dir, resumed_from, revalidate


def _trainer(plan: WorkerPlan, overrides: dict[str, Any], device: torch.device, world_size: int) -> Any:
    from yolo_ray.worker.trainer import trainer_class  # imports ultralytics: only after Ray set the ranks

    return trainer_class(overrides["task"])(
        overrides,
        nbs=overrides.get("nbs"),  # a resumed run's last.pt holds the nbs of the size it was saved at
        device=device,
        world_size=world_size,
        sync_bn=plan.sync_bn,
        loader=plan.loader,
        device_cache=plan.device_cache,
        channels_last=plan.channels_last,
        cuda_graphs=plan.cuda_graphs,
        val_cuda_graphs=plan.val_cuda_graphs,
        grad_clip=plan.grad_clip,
        val_async=plan.val_async is not None,
        stream=plan.stream,
    )


def _attach(
    plan: WorkerPlan,
    trainer: Any,
    run_dir: Path,
    rank: int,
    resumed_from: int | None,
    revalidate: list[int],
    stack: ExitStack,
) -> EpochReporter:
    """The trainer's callbacks: the user's, the per-epoch report (and async validation), progress, profiling."""
    user_callbacks.attach(trainer, list(plan.callbacks), rank)
    reporter = EpochReporter(trainer, run_dir, resumed_from, plan.fault.or_env())
    reporter.attach()
    if rank == 0 and plan.val_async is not None:
        reporter.validate_async(plan.val_async, revalidate)
        stack.callback(trainer.async_val.close)
    if rank == 0:
        ProgressWriter(run_dir).attach(trainer)
    if rank == 0 and plan.profile_steps:
        from yolo_ray.worker.profiling import StepProfiler

        StepProfiler(run_dir, plan.profile_steps).attach(trainer)
    return reporter


def export_best(best: Path, data: Path, imgsz: int, run_dir: Path) -> None:
    """Rank 0: best.pt (plain EMA weights, never the DDP wrapper) -> export/model.onnx, checked on 4 val images."""
    from yolo_ray.data.checks import split_images
    from yolo_ray.tracking.export import export_and_check

    out = layout.export(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    export_and_check(best, sorted(split_images(data, "val"))[:4], imgsz, out)  # the driver reports it


def finish_trained_run(plan: WorkerPlan, run_dir: Path, overrides: dict[str, Any], epochs: int, rank: int) -> None:
    """For a run whose every epoch is saved: what Ultralytics' final_eval and yolo_ray's end of training do (validate
    best.pt, final_metrics.json, the export). Every rank validates the whole val split alone, as the CPU final_eval
    does: Ultralytics' dataset set-up holds a barrier for all ranks; rank 0 writes the results."""
    from ultralytics import YOLO

    from yolo_ray.worker.trainer import undistributed_validation

    weights = layout.weights(run_dir)
    best = weights / "best.pt" if (weights / "best.pt").exists() else weights / "last.pt"
    if rank == 0:
        say(f"[yolo_ray] every epoch is trained (epoch-{epochs} checkpoint): validating {best.name} and finishing")
    with undistributed_validation():
        metrics = YOLO(str(best)).val(
            data=overrides["data"],
            imgsz=overrides["imgsz"],
            batch=overrides["batch"],
            device=overrides["device"],
            plots=overrides.get("plots", True) and rank == 0,
            project=str(run_dir / "train"),
            name=f"final_val{'' if rank == 0 else rank}",
            exist_ok=True,
        )
    if rank != 0:
        return
    final = final_record(epochs, metrics.results_dict, metrics.names, overrides.get("task", "detect"))
    (run_dir / layout.FINAL_METRICS).write_text(json.dumps(final, indent=2))
    if plan.export:
        export_best(best, Path(overrides["data"]), overrides["imgsz"], run_dir)


def resume_point(run_dir: Path, stack: ExitStack) -> tuple[str | None, int | None]:
    """The newest complete epoch checkpoint: Ray's registered one, or a newer one already persisted in the run
    directory (a driver or worker that died right after a report leaves the checkpoint on storage before Ray's
    controller registered it; resuming from it means no epoch is trained twice)."""
    candidates = layout.checkpoints(run_dir)
    registered = ray.train.get_checkpoint()
    if registered is not None:
        candidates.append(Path(stack.enter_context(registered.as_directory())))
    newest = newest_checkpoint(candidates)
    return (str(newest[1]), newest[0]) if newest else (None, None)


def reconcile_history(run_dir: Path, ckpt_dir: Path, awaiting: set[int] | None = None) -> None:
    """history.jsonl as of the checkpoint resumed from, written back: a process killed between persisting epoch
    k's checkpoint and appending its line left the line out (the checkpoint carries it); lines of epochs after the
    checkpoint (trained again now) are dropped, so every epoch has one line. awaiting: epochs (0-based) validated
    again now (train.val_async), whose lines are written when their results come."""
    meta = json.loads((ckpt_dir / "meta.json").read_text())
    rows = read_history(run_dir)
    kept = [r for r in rows if r["epoch"] <= meta["epoch"]]
    validated_again = meta["epoch"] - 1 in (awaiting or set())
    if not validated_again and not any(r["epoch"] == meta["epoch"] for r in kept) and "metrics" in meta:
        kept.append({"time": time.time(), **meta["metrics"]})
    if kept != rows:
        write_history(run_dir, kept)


def unvalidated_epochs(run_dir: Path, epochs_done: int) -> list[int]:
    """train.val_async after a restart: epochs (0-based) of the checkpoint resumed from or before, kept for
    validation and without a history line (their result never came back); kept epochs after the checkpoint are
    trained again, and those with a line were done."""
    weights = layout.weights(run_dir)
    lined = {r["epoch"] - 1 for r in read_history(run_dir)}
    out = []
    for epoch in async_val.awaiting_epochs(weights):
        kept = async_val.awaiting_dir(weights, epoch)
        if epoch >= epochs_done or epoch in lined or not (kept / "row.json").exists():
            shutil.rmtree(kept, ignore_errors=True)
        else:
            out.append(epoch)
    return out


def remove_stale_staging(weights_dir: Path) -> None:
    """Staging directories of checkpoints a killed worker had not persisted (the run directory is locked to this
    driver, and no checkpoint is being written yet)."""
    for d in weights_dir.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(d, ignore_errors=True)


def write_rank_record(trainer: Any, run_dir: Path, ctx: Any, device: torch.device, resumed_from: int | None) -> None:
    """ranks/rank<N>.json: who this rank was and what it trained (read by tests and for debugging)."""
    record = {
        "world_rank": ctx.get_world_rank(),
        "local_rank": ctx.get_local_rank(),
        "node_rank": ctx.get_node_rank(),
        "world_size": ctx.get_world_size(),
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")},
        "hostname": socket.gethostname(),
        "node_ip": ray.util.get_node_ip_address(),
        "device": str(device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "resumed_from_epoch": resumed_from,
        "param_sha256": trainer.parameter_digest(),
        "per_worker_batch": trainer.batch_size // max(trainer.world_size, 1),
        "accumulate": trainer.accumulate,
        "shard_indices_epoch0": trainer.shard_indices,
        "cached_images": len(trainer.train_loader.cache) if trainer.loader == "device" else None,
        "ring_images": trainer.train_loader.ring.size if trainer.loader == "stream" else None,
        "loader_epochs": getattr(trainer.train_loader, "epochs_served", None),  # device loader: epoch of each pass
    }
    out = layout.ranks(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{record['world_rank']}.json").write_text(json.dumps(record))

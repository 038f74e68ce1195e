"""The Ray Train worker: where ranks and devices are decided and each epoch is reported.

Runs once per Ray worker process. Ray has already set RANK / LOCAL_RANK / WORLD_SIZE / NODE_RANK and created the
process group; this function imports Ultralytics only now, so Ultralytics sees those ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import ray.train
import torch
import torch.distributed as dist

from yolo_ray import faults
from yolo_ray.metrics import epoch_metrics, final_metrics
from yolo_ray.summary import append_history, read_history


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """config: launcher.train's train_loop_config (Ultralytics overrides, run_dir, sync_bn, loader, channels_last,
    profile_steps, fault, export)."""
    from yolo_ray import ultralytics_env

    ultralytics_env.set_offline_env()
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if isinstance(device, list):  # several GPUs per worker: DDP still drives one
        device = device[0]
    ultralytics_env.disable_integrations()

    from yolo_ray.trainer import RayDetectionTrainer  # imports ultralytics: only after Ray set the ranks

    run_dir = Path(config["run_dir"])
    overrides = dict(config["overrides"])
    overrides["device"] = "cpu" if device.type == "cpu" else str(device.index)

    with ExitStack() as stack:
        if rank == 0:
            remove_stale_staging(run_dir / "train" / "weights")
        ckpt_dir, resumed_from = _broadcast(resume_point(run_dir, stack))
        if ckpt_dir is not None:
            overrides["resume"] = str(Path(ckpt_dir) / "last.pt")
            if rank == 0:
                print(f"[yolo_ray] resuming from the epoch-{resumed_from} checkpoint {ckpt_dir}", flush=True)
                reconcile_history(run_dir, Path(ckpt_dir))

        trainer = RayDetectionTrainer(
            overrides,
            device=device,
            world_size=world_size,
            sync_bn=config["sync_bn"],
            loader=config["loader"],
            device_cache=config["device_cache"],
            channels_last=config["channels_last"],
            cuda_graphs=config["cuda_graphs"],
        )
        reporter = EpochReporter(trainer, run_dir, resumed_from, faults.FaultPlan.from_config(config.get("fault")))
        reporter.attach()
        if rank == 0 and config["profile_steps"]:
            from yolo_ray.profiling import StepProfiler

            StepProfiler(run_dir, config["profile_steps"]).attach(trainer)
        trainer.train()
        write_rank_record(trainer, run_dir, ctx, device, resumed_from)
        if rank == 0:
            (run_dir / "final_metrics.json").write_text(json.dumps(final_metrics(trainer), indent=2))
            if config.get("export") and trainer.best.exists():
                export_best(trainer, run_dir)


def export_best(trainer: Any, run_dir: Path) -> None:
    """Rank 0: best.pt (plain EMA weights, never the DDP wrapper) -> export/model.onnx, checked on val images."""
    from yolo_ray.export import export_and_check

    val_images = sorted(trainer.validator.dataloader.dataset.im_files)[:4]
    out = run_dir / "export"
    out.mkdir(parents=True, exist_ok=True)
    check = export_and_check(trainer.best, [Path(p) for p in val_images], trainer.args.imgsz, out)
    print(
        f"[yolo_ray] exported {trainer.best} -> {out / 'model.onnx'} (onnxruntime vs PyTorch max |diff| "
        f"{check['max_abs_diff']:.2e} of scale {check['output_scale']:.1f})",
        flush=True,
    )


STAGING_PREFIX = ".yolo_ray_ckpt_"  # a report's staging directory beside last.pt
SHOWN = ("train/box_loss", "train/cls_loss", "precision", "recall", "mAP50", "mAP50-95", "lr/pg0", "images_per_s")


def resume_point(run_dir: Path, stack: ExitStack) -> tuple[str | None, int | None]:
    """The newest complete epoch checkpoint: Ray's registered one, or a newer one already persisted in the run
    directory (a driver or worker that died right after a report leaves the checkpoint on storage before Ray's
    controller registered it; resuming from it means no epoch is trained twice)."""
    candidates = list(run_dir.glob("checkpoint_*"))
    registered = ray.train.get_checkpoint()
    if registered is not None:
        candidates.append(Path(stack.enter_context(registered.as_directory())))
    best: tuple[int, str] | None = None
    for d in candidates:
        try:
            meta = json.loads((d / "meta.json").read_text())
            complete = (d / "last.pt").stat().st_size == meta["last_pt_bytes"]
        except (OSError, KeyError, ValueError):
            continue  # partly written
        if complete and (best is None or meta["epoch"] > best[0]):
            best = (meta["epoch"], str(d))
    return (best[1], best[0]) if best else (None, None)


def reconcile_history(run_dir: Path, ckpt_dir: Path) -> None:
    """history.jsonl as of the checkpoint resumed from: a process killed between persisting epoch k's checkpoint
    and appending its line left the line out; the checkpoint carries it."""
    meta = json.loads((ckpt_dir / "meta.json").read_text())
    rows = [r for r in read_history(run_dir) if r["epoch"] <= meta["epoch"]]
    if not any(r["epoch"] == meta["epoch"] for r in rows) and "metrics" in meta:
        append_history(run_dir, meta["metrics"])


class EpochReporter:
    """Ultralytics callbacks that time each epoch and hand metrics plus a checkpoint to Ray Train."""

    def __init__(self, trainer: Any, run_dir: Path, resumed_from: int | None, fault: faults.FaultPlan):
        self.trainer, self.run_dir, self.resumed_from, self.fault = trainer, run_dir, resumed_from, fault
        self.rank = ray.train.get_context().get_world_rank()
        self.t_epoch = self.t_train_end = 0.0
        self.start_digest = ""

    def attach(self) -> None:
        self.trainer.add_callback("on_train_start", self.on_train_start)
        self.trainer.add_callback("on_train_epoch_start", self.on_train_epoch_start)
        self.trainer.add_callback("on_train_epoch_end", self.on_train_epoch_end)
        self.trainer.add_callback("on_fit_epoch_end", self.on_fit_epoch_end)

    def on_train_start(self, trainer: Any) -> None:
        if self.rank == 0:  # the weights this attempt starts from (a resumed one: the checkpoint's)
            self.start_digest = trainer.parameter_digest(as_saved=True)

    def on_train_epoch_start(self, trainer: Any) -> None:
        self.fault.maybe_fail(rank=self.rank, epoch_about_to_start=trainer.epoch + 1, resumed_from=self.resumed_from)
        self.t_epoch = time.perf_counter()

    def on_train_epoch_end(self, trainer: Any) -> None:
        self.t_train_end = time.perf_counter()

    def on_fit_epoch_end(self, trainer: Any) -> None:
        if trainer.in_final_eval:
            return
        t_fit_end = time.perf_counter()
        metrics = None
        if self.rank == 0:
            metrics = epoch_metrics(trainer, self.t_train_end - self.t_epoch, self.resumed_from)
            metrics["save_s"] = t_fit_end - self.t_train_end  # Ultralytics' end of epoch: validation, CSV, last.pt
            metrics["start_weights_sha256"] = self.start_digest
            metrics["saved_weights_sha256"] = trainer.checkpoint_digest()
            print(
                f"[yolo_ray] epoch {metrics['epoch']}/{trainer.epochs} "
                + " ".join(f"{k}={_fmt(metrics[k])}" for k in SHOWN if k in metrics),
                flush=True,
            )
        metrics = _broadcast(metrics)
        if self.rank == 0 and trainer.last.exists():
            with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX, dir=trainer.last.parent) as tmp:
                stage(trainer.last, Path(tmp) / "last.pt")
                meta = {
                    "epoch": metrics["epoch"],
                    "last_pt_bytes": (Path(tmp) / "last.pt").stat().st_size,
                    "metrics": {**metrics, "time": time.time()},
                }
                (Path(tmp) / "meta.json").write_text(json.dumps(meta))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        else:
            ray.train.report(metrics)
        if self.rank == 0:  # after the report: history lists only epochs whose checkpoint is persisted
            # report_s: all of yolo_ray's end of epoch (metrics, digest, checkpoint report), not only Ray's call
            append_history(self.run_dir, {**metrics, "report_s": time.perf_counter() - t_fit_end})


def remove_stale_staging(weights_dir: Path) -> None:
    """Staging directories a worker killed inside a report left behind (the run directory is locked to this driver,
    and no report is running yet)."""
    for d in weights_dir.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(d, ignore_errors=True)


def stage(last_pt: Path, staged: Path) -> None:
    """last.pt into the directory handed to Ray as a hard link, not a copy (one ~100 MB write less an epoch for
    YOLO11m): Ray's report copies the bytes into storage before it returns (pyarrow copy_files), and Ultralytics
    rewrites last.pt in place only at the next epoch's end, after the staging directory is gone."""
    try:
        os.link(last_pt, staged)
    except OSError:  # a filesystem without hard links
        shutil.copy2(last_pt, staged)


def _broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank (so every rank reports the same metrics)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


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
        "cached_images": len(trainer.train_loader.cache) if hasattr(trainer.train_loader, "cache") else None,
    }
    out = run_dir / "ranks"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{record['world_rank']}.json").write_text(json.dumps(record))

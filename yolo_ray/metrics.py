"""Names and values of what each epoch reports: Ultralytics' metrics under MLflow-safe, stable keys."""

from __future__ import annotations

import re
from typing import Any

from yolo_ray import tasks

# Ultralytics' metric keys -> ours (MLflow rejects parentheses in metric names); every task's (tasks.py).
RENAMES = tasks.RENAMES
LOSS = re.compile(r"^(train|val)/\w*loss$")  # each task's own loss items: box, cls, dfl, seg, pose, kobj, loss


def sweepable(name: str) -> bool:
    """What every epoch reports that a sweep can optimise (Tune's metric): a score, fitness, or a loss."""
    key = tasks.metric_key(name)
    return key in tasks.SCORES or key == "fitness" or bool(LOSS.match(key))


def scores(metrics: dict[str, Any]) -> dict[str, float]:
    """The scores among a metrics dict (what summary.json's `final` and the registry's tags hold)."""
    return {k: metrics[k] for k in tasks.SCORES if isinstance(metrics.get(k), (int, float))}


def headline(final: dict[str, Any]) -> str:
    """The run's final scores in one line: mAP50 and mAP50-95 of each kind the task has, or top-1 / top-5."""
    shown = [k for k in tasks.SCORES if ("mAP" in k or k.startswith("top")) and isinstance(final.get(k), float)]
    return " ".join(f"{k}={final[k]:.4f}" for k in shown) or "no scores"


def clean(metrics: dict[str, Any]) -> dict[str, float]:
    return {RENAMES.get(k, k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def epoch_metrics(trainer: Any, train_seconds: float, resumed_from: int | None) -> dict[str, Any]:
    """Rank 0's view of the epoch just finished (validation included)."""
    images = len(trainer.train_loader.dataset)  # all ranks together see the whole train set once per epoch
    out: dict[str, Any] = {"epoch": trainer.epoch + 1}
    out.update(clean(trainer.label_loss_items(trainer.tloss, prefix="train") if trainer.tloss else {}))
    out.update(clean(trainer.metrics or {}))
    out.update({k: float(v) for k, v in trainer.lr.items()})
    out["fitness"] = float(trainer.fitness) if trainer.fitness is not None else 0.0
    out["epoch_time_s"] = float(trainer.epoch_time or 0.0)
    out["train_time_s"] = float(train_seconds)
    out["images_per_s"] = images / train_seconds if train_seconds > 0 else 0.0
    if getattr(trainer, "val_seconds", None) is not None:  # Ultralytics' per-image phases, and the whole of it
        out["val_s"] = float(trainer.val_seconds)
        out.update({f"val_ms_per_image/{k}": float(v) for k, v in trainer.validator.speed.items()})
    feed = getattr(trainer.train_loader, "feed_clock", None)  # the stream loader's stages (data/feed_clock.py)
    if feed is not None:
        out.update(feed.metrics())
    if getattr(trainer, "grad_norms", None) is not None:  # the epoch's gradient norms before clipping
        out.update(trainer.grad_norms.epoch_summary())
    out["world_size"] = world = int(max(trainer.world_size, 1))
    # this group's split of the global batch (batch_plan): an elastic group's changes with its size, not the step's
    out["per_worker_batch"] = trainer.batch_size // world
    out["images_per_step"] = max(round(trainer.args.nbs / trainer.batch_size), 1) * trainer.batch_size
    out["gpu_mem_peak_gib"] = _peak_gpu_gib(trainer)
    held = getattr(trainer.train_loader, "data_device_bytes", None)  # the device and stream loaders' own data
    if held is not None:
        out["data_device_peak_gib"] = round(held() / 2**30, 4)
    out["resumed_from_epoch"] = -1 if resumed_from is None else int(resumed_from)
    return out


def final_metrics(trainer: Any) -> dict[str, Any]:
    """Metrics of the final validation of best.pt (rank 0, after training)."""
    return final_record(trainer.epoch + 1, trainer.metrics or {}, trainer.data["names"], trainer.args.task)


def final_record(epochs: int, results: dict[str, Any], names: dict, task: str) -> dict[str, Any]:
    """final_metrics.json: the validation of best.pt after `epochs`, with its task and that task's headline key."""
    names = {int(k): str(v) for k, v in names.items()}
    return {
        "epochs_completed": epochs,
        **clean(results),
        "names": names,
        "task": task,
        "headline": tasks.get(task).headline,
    }


def _peak_gpu_gib(trainer: Any) -> float:
    import torch

    if trainer.device.type != "cuda":
        return 0.0
    return torch.cuda.max_memory_allocated(trainer.device) / 2**30

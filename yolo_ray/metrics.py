"""Names and values of what each epoch reports: Ultralytics' metrics under MLflow-safe, stable keys."""

from __future__ import annotations

from typing import Any

# Ultralytics' metric keys -> ours (MLflow rejects parentheses in metric names).
RENAMES = {
    "metrics/precision(B)": "precision",
    "metrics/recall(B)": "recall",
    "metrics/mAP50(B)": "mAP50",
    "metrics/mAP50-95(B)": "mAP50-95",
}


# What every epoch reports that a sweep can optimise (Tune's metric): the scores and the losses.
SWEEPABLE = (
    "mAP50-95", "mAP50", "precision", "recall", "fitness",
    *(f"{split}/{loss}_loss" for split in ("train", "val") for loss in ("box", "cls", "dfl")),
)  # fmt: skip


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
    out["world_size"] = world = int(max(trainer.world_size, 1))
    # this group's split of the global batch (batch_plan): an elastic group's changes with its size, not the step's
    out["per_worker_batch"] = trainer.batch_size // world
    out["images_per_step"] = max(round(trainer.args.nbs / trainer.batch_size), 1) * trainer.batch_size
    out["gpu_mem_peak_gib"] = _peak_gpu_gib(trainer)
    out["resumed_from_epoch"] = -1 if resumed_from is None else int(resumed_from)
    return out


def final_metrics(trainer: Any) -> dict[str, Any]:
    """Metrics of the final validation of best.pt (rank 0, after training)."""
    names = {int(k): str(v) for k, v in trainer.data["names"].items()}
    return {"epochs_completed": trainer.epoch + 1, **clean(trainer.metrics or {}), "names": names}


def _peak_gpu_gib(trainer: Any) -> float:
    import torch

    if trainer.device.type != "cuda":
        return 0.0
    return torch.cuda.max_memory_allocated(trainer.device) / 2**30

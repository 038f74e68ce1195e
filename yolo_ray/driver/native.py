"""The same experiment trained by plain Ultralytics in one process: the baseline for parity tests and benchmarks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError, ExperimentConfig
from yolo_ray.config_schema import ULTRALYTICS_GRAD_CLIP
from yolo_ray.inputs import check_storage, prepare, ultralytics_overrides
from yolo_ray.metrics import clean, scores


class EpochTimer:
    """Each epoch's training seconds and end-of-epoch seconds (validation, CSV, last.pt), one JSON line per epoch:
    what the benchmark needs to compare time to accuracy with and without validation. Its callbacks run in this
    process only: under Ultralytics' own DDP (device "0,1") the spawned processes never see them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.t_start = 0.0
        self.t_train_end: float | None = None

    def attach(self, yolo: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        yolo.add_callback("on_train_epoch_start", self._start)
        yolo.add_callback("on_train_epoch_end", self._train_end)
        yolo.add_callback("on_fit_epoch_end", self._fit_end)

    def _start(self, trainer: Any) -> None:
        self.t_start = time.perf_counter()

    def _train_end(self, trainer: Any) -> None:
        self.t_train_end = time.perf_counter()

    def _fit_end(self, trainer: Any) -> None:
        if self.t_train_end is None:  # the final evaluation of best.pt, not an epoch
            return
        row = {"epoch": trainer.epoch + 1, "train_s": self.t_train_end - self.t_start}
        row["end_s"] = time.perf_counter() - self.t_train_end
        self.t_train_end = None
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def native_device(cfg: ExperimentConfig) -> str:
    """Ultralytics' device string for the config's scaling: `cpu` without GPUs, else one GPU per configured worker
    (`auto`: every local GPU), as Ultralytics' own DDP would run them."""
    import torch

    gpus = torch.cuda.device_count()
    if cfg.scaling.use_gpu is False or gpus == 0:
        return "cpu"
    n = gpus if cfg.scaling.num_workers == "auto" else min(int(cfg.scaling.num_workers), gpus)
    return ",".join(str(i) for i in range(n))


def train_native(cfg: ExperimentConfig, device: str = "cpu") -> dict[str, Any]:
    """Train with `ultralytics.YOLO(model).train(...)`; returns a summary like yolo_ray's.

    device: Ultralytics' own notion, e.g. "cpu", "0", or "0,1" (its torch.distributed.run DDP launcher).
    """
    if cfg.train.grad_clip != ULTRALYTICS_GRAD_CLIP:  # refused before Ultralytics is imported
        raise ConfigError(
            cfg.source,
            "train.grad_clip",
            f"is {cfg.train.grad_clip}, but native Ultralytics always clips at {ULTRALYTICS_GRAD_CLIP}.",
            "train without --native, or leave train.grad_clip at its default.",
        )
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()  # Ultralytics' own output, as a native run prints it
    from ultralytics import YOLO

    started = time.time()
    checked = prepare(cfg)
    run_dir = check_storage(cfg)
    data_yaml = checked.dataset.write(run_dir)  # the same resolved data.yaml yolo_ray's workers read
    model = checked.model
    overrides = ultralytics_overrides(cfg, model, data_yaml, run_dir / "train", checked.task)
    overrides.pop("model")
    overrides["device"] = device
    yolo = YOLO(model)
    EpochTimer(run_dir / layout.NATIVE_EPOCHS).attach(yolo)
    yolo.train(**overrides)
    metrics = clean(yolo.trainer.metrics or {})
    summary = {
        "status": "finished",
        "run_name": cfg.run.name,
        "run_dir": str(run_dir),
        "native": True,
        "final": scores(metrics),
        "epochs_completed": getattr(yolo.trainer, "epoch", cfg.train.epochs - 1) + 1,  # a DDP parent never trains
        "world_size": 1,
        "wall_time_s": round(time.time() - started, 2),
    }
    (run_dir / layout.SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary

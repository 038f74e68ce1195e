"""The same experiment trained by plain Ultralytics in one process: the baseline for parity tests and benchmarks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from yolo_ray.config import ExperimentConfig
from yolo_ray.launcher import prepare, ultralytics_overrides
from yolo_ray.metrics import clean


def train_native(cfg: ExperimentConfig, device: str = "cpu") -> dict[str, Any]:
    """Train with `ultralytics.YOLO(model).train(...)`; returns a summary like yolo_ray's.

    device: Ultralytics' own notion, e.g. "cpu", "0", or "0,1" (its torch.distributed.run DDP launcher).
    """
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    from ultralytics import YOLO

    started = time.time()
    model, data_yaml = prepare(cfg)
    run_dir = (Path(cfg.run.storage_path).expanduser() / cfg.run.name).resolve()
    overrides = ultralytics_overrides(cfg, model, data_yaml, run_dir / "train")
    overrides.pop("model")
    overrides["device"] = device
    yolo = YOLO(model)
    yolo.train(**overrides)
    metrics = clean(yolo.trainer.metrics or {})
    summary = {
        "status": "finished",
        "run_name": cfg.run.name,
        "run_dir": str(run_dir),
        "native": True,
        "final": {k: metrics[k] for k in ("mAP50", "mAP50-95", "precision", "recall") if k in metrics},
        "epochs_completed": getattr(yolo.trainer, "epoch", cfg.train.epochs - 1) + 1,  # a DDP parent never trains
        "world_size": 1,
        "wall_time_s": round(time.time() - started, 2),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary

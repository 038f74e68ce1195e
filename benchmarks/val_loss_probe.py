"""Why does a young run's val/cls_loss spike (13,045 at epoch 5 of a smoke run)? Each epoch checkpoint's EMA model
on the val split, twice: in eval mode (BatchNorm's running statistics: what Ultralytics validates) and with batch
statistics. Per batch: the cls loss, the share of class logits above 0, the largest logit, the assigned anchors.

    yolo-ray train experiments/smoke.yaml train.epochs=8 train.extra.save_period=1 run.name=probe tracking.enabled=false
    python benchmarks/val_loss_probe.py runs/probe datasets/shapes/data.yaml 128
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch


def main(run_dir: Path, data_yaml: Path, imgsz: int) -> None:
    from yolo_ray import ultralytics_env

    ultralytics_env.setup(verbose=False)
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils.loss import v8DetectionLoss

    data = check_det_dataset(str(data_yaml))
    args = get_cfg(overrides={"imgsz": imgsz})
    loader = build_dataloader(build_yolo_dataset(args, data["val"], 32, data, mode="val", stride=32), 32, 0, False, -1)
    epochs = sorted(run_dir.glob("train/weights/epoch*.pt"), key=lambda p: int(p.stem[5:]))
    for path in epochs:
        model = torch.load(path, map_location="cpu", weights_only=False)["ema"].float()
        model.args = args
        criterion = v8DetectionLoss(model)
        for mode in ("eval", "batch-stats"):
            model.train(mode == "batch-stats")
            rows = []
            with torch.no_grad():
                for batch in loader:
                    batch["img"] = batch["img"].float() / 255
                    preds = criterion.parse_output(model(batch["img"]))
                    (fg, *_), _, items = criterion.get_assigned_targets_and_loss(preds, batch)
                    scores = preds["scores"]
                    rows.append((items["cls_loss"].item(), (scores > 0).float().mean().item(), scores.max().item()))
            r = np.array(rows)
            print(
                f"epoch {int(path.stem[5:]) + 1} {mode:11s} cls loss per batch {r[:, 0].round(1)}  "
                f"logits > 0 {r[:, 1].round(3)}  largest logit {r[:, 2].round(1)}"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))

"""Ultralytics' DetectionValidator against yolo_ray's batched one (worker/batched_val.py) on the same weights and
the same val batches (kept on the device, as training validates them), fp16 on a GPU, conf 0.001: every metric side
by side, each validation's seconds and the share spent in NMS and matching (postprocess, update_metrics and
gather_stats, timed with the device synchronized), the two alternated so that neither always runs first.
`untrained` validates a freshly built model: the most boxes NMS ever sees (a young run's first epochs).
`batched_whole_nms` is the batched validator giving NMS all of each image's candidates at once (before it tried
each image's most confident NMS_PREFIX first): the same detections, by _greedy_keep's argument.

    python benchmarks/val_batched_probe.py RUN/train/weights/best.pt datasets/parity/data.yaml 640 --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

STEPS = ("postprocess", "update_metrics", "gather_stats")  # the validator's NMS and matching


def _timed(v: Any, spent: list[float]) -> None:
    """Wrap the validator's NMS and matching steps to add their synchronized seconds to spent[0]."""
    for name in STEPS:
        step = getattr(v, name)

        def timed(*args: Any, _step: Any = step) -> Any:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            started = time.perf_counter()
            out = _step(*args)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            spent[0] += time.perf_counter() - started
            return out

        setattr(v, name, timed)


def _model(weights: str, nc: int) -> Any:
    if weights != "untrained":
        return weights
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    return DetectionModel("yolo11n.yaml", nc=nc, verbose=False).eval()


def _whole_nms() -> type:
    from yolo_ray.worker import batched_val

    class WholeNMS(batched_val.BatchedDetectionValidator):
        def postprocess(self, preds: Any) -> Any:
            saved, batched_val.NMS_PREFIX = batched_val.NMS_PREFIX, 1 << 62
            try:
                return super().postprocess(preds)
            finally:
                batched_val.NMS_PREFIX = saved

    return WholeNMS


def probe(weights: str, data: Path, imgsz: int, batch: int, repeats: int) -> dict[str, Any]:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.models.yolo.detect import DetectionValidator

    from yolo_ray.worker.batched_val import BatchedDetectionValidator
    from yolo_ray.worker.val_batches import on_device

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    args = {"data": str(data), "imgsz": imgsz, "batch": batch, "plots": False, "conf": 0.001, "half": cuda,
            "device": "0" if cuda else "cpu", "verbose": False, "rect": True}  # fmt: skip
    info = check_det_dataset(str(data))
    dataset = build_yolo_dataset(get_cfg(overrides=args), info["val"], batch, info, mode="val", stride=32)
    loader = on_device(build_dataloader(dataset, batch, workers=8, shuffle=False, rank=-1), device)
    kinds = {"ultralytics": DetectionValidator, "batched": BatchedDetectionValidator, "batched_whole_nms": _whole_nms()}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    metrics: dict[str, dict] = {}
    images: dict[str, dict] = {}
    for r in range(repeats):
        for name in list(kinds)[r % 3 :] + list(kinds)[: r % 3]:  # each goes first in turn
            v = kinds[name](dataloader=loader, args=dict(args))
            spent = [0.0]
            _timed(v, spent)
            started = time.perf_counter()
            metrics[name] = v(model=_model(weights, len(info["names"])))
            runs[name].append((time.perf_counter() - started, spent[0]))
            images[name] = v.metrics.box.image_metrics
    rows = [{"metric": k, "ultralytics": up, "batched": metrics["batched"][k], "diff": metrics["batched"][k] - up,
             "whole_nms_diff": metrics["batched_whole_nms"][k] - metrics["batched"][k]}
            for k, up in metrics["ultralytics"].items()]  # fmt: skip
    timing = {k: {"validation_s": statistics.mean(t for t, _ in v[1:]), "nms_and_matching_s":
                  statistics.mean(s for _, s in v[1:]), "runs": v} for k, v in runs.items()}  # fmt: skip
    return {"weights": weights, "args": args, "metrics": rows, "timing": timing,
            "same_per_image": images["ultralytics"] == images["batched"],
            "whole_nms_same_per_image": images["batched_whole_nms"] == images["batched"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("weights", nargs="+", help="checkpoints, or `untrained`")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=128)  # the trainer's val batch: twice the training batch of 64
    ap.add_argument("--repeats", type=int, default=5)  # the first (warm-up) is not counted
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from yolo_ray import ultralytics_env

    ultralytics_env.setup(verbose=False)
    results = [probe(w, a.data, a.imgsz, a.batch, a.repeats) for w in a.weights]
    for res in results:
        print(
            f"\n{res['weights']}  (per-image TP/FP/FN identical: {res['same_per_image']}; batched with whole-image "
            f"NMS: {res['whole_nms_same_per_image']})"
        )
        print(f"{'metric':24} {'ultralytics':>12} {'batched':>12} {'diff':>10}")
        for row in res["metrics"]:
            print(f"{row['metric']:24} {row['ultralytics']:12.5f} {row['batched']:12.5f} {row['diff']:10.2e}")
        t = res["timing"]
        print(f"{'seconds':24} {'ultralytics':>12} {'batched':>12} {'vs ultr.':>9} {'whole NMS':>10} {'vs ultr.':>9}")
        for key in "validation_s", "nms_and_matching_s":
            up, ours, whole = (t[k][key] for k in ("ultralytics", "batched", "batched_whole_nms"))
            print(f"{key:24} {up:12.3f} {ours:12.3f} {ours / up:8.2f}x {whole:10.3f} {whole / up:8.2f}x")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

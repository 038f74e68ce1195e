"""The device loader on a GPU against its own reference and against Ultralytics' CPU pipeline, on one dataset.

The CPU tests (tests/data/test_device_loader.py, test_augment_kernel.py) compare the torch reference with Ultralytics
and the fused kernel with the reference in Triton's interpreter. This runs the same comparisons where training runs:
the compiled kernel on CUDA against the reference on CUDA (same random draws: boxes equal, pixels within rounding),
and batch statistics of the GPU stream (CUDA generator, fused kernel) against Ultralytics' samples.

    python benchmarks/augment_probe.py DATA_YAML [IMGSZ] [SAMPLES]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import torch


def dataset(data_yaml: str, imgsz: int, **hyp: float):
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    args = get_cfg(overrides={"imgsz": imgsz, "cache": False, **hyp})
    data = check_det_dataset(data_yaml)
    return args, build_yolo_dataset(args, data["train"], 16, data, mode="train", stride=32)


def stats(labels: list[torch.Tensor], img: torch.Tensor) -> dict[str, float]:
    boxes = torch.cat(labels).float().cpu()
    side = (boxes[:, 3] * boxes[:, 4]).sqrt() * img.shape[-1]
    f = img.float()
    return {
        "boxes_per_image": len(boxes) / len(labels),
        "empty_fraction": sum(len(lb) == 0 for lb in labels) / len(labels),
        "side_px_p05": float(side.quantile(0.05)),
        "side_px_median": float(side.median()),
        "side_px_p90": float(side.quantile(0.9)),
        "x_mean": float(boxes[:, 1].mean()),
        "y_mean": float(boxes[:, 2].mean()),
        "pixel_mean": float(f.mean()),
        "pixel_std": float(f.std()),
    }


def main() -> None:
    from yolo_ray.data.device_augment import AugmentHyp, augment_batch
    from yolo_ray.data.device_cache import DeviceCache

    data_yaml, imgsz = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 640
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a slow dry run (Triton's interpreter)
    out: dict = {"imgsz": imgsz, "samples": n}
    for name, hyp in (("mosaic", {}), ("close-mosaic", {"mosaic": 0.0})):
        args, ds = dataset(data_yaml, imgsz, **hyp)
        cache = DeviceCache.build(ds, imgsz, dev, threads=8, ids=list(range(min(len(ds), 600))))
        h = AugmentHyp.from_args(args)
        idx = torch.arange(64, device=dev) % len(cache)
        (ref, rt), (fused, ft) = (augment_batch(cache, idx, h, torch.Generator(dev).manual_seed(5), f) for f in (0, 1))
        diff = (ref.int() - fused.int()).abs()
        check = {
            "boxes_equal": all(torch.equal(rt[k], ft[k]) for k in rt),
            "pixel_max_diff": int(diff.max()),
            "pixel_diff_fraction": float((diff > 0).float().mean()),
        }
        g = torch.Generator(dev).manual_seed(0)
        imgs, labels = [], []
        for start in range(0, n, 64):
            b = torch.arange(start, min(n, start + 64), device=dev) % len(cache)
            img, t = augment_batch(cache, b, h, g)
            imgs.append(img.cpu())
            labels += [
                torch.cat([t["cls"][t["batch_idx"] == i], t["bboxes"][t["batch_idx"] == i]], 1).cpu()
                for i in range(len(b))
            ]
        _, theirs_ds = dataset(data_yaml, imgsz, **hyp)  # the cache switched `ds` to no augmentation
        random.seed(0)
        np.random.seed(0)
        items = [theirs_ds[i % len(cache)] for i in range(n)]
        theirs = [torch.cat([it["cls"].reshape(-1, 1), it["bboxes"]], 1) for it in items]
        out[name] = {
            "fused_vs_reference_on_cuda": check,
            "gpu_stream": stats(labels, torch.cat(imgs)),
            "ultralytics": stats(theirs, torch.stack([it["img"] for it in items])),
        }
        print(name, json.dumps(out[name], indent=1))
    Path(sys.argv[4] if len(sys.argv) > 4 else "augment_probe.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

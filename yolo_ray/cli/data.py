"""`yolo-ray data`: dataset tools: `data synth` writes a generated dataset."""

from __future__ import annotations

import argparse
import json
from typing import Any

from yolo_ray.config import ConfigError


def add(sub: Any) -> None:
    d = sub.add_parser("data", help="dataset tools").add_subparsers(dest="data_command", required=True)
    s = d.add_parser(
        "synth",
        help="write a generated detection dataset (YOLO format, train/val, data.yaml)",
        description="Write a learnable detection dataset. style=shapes (default): square images with 1-4 large "
        "shapes, quick to learn. style=real: scenes shaped like real data (9 sizes from 320x240 to 1280x720 at "
        "imgsz=640, 0-15 objects down to ~1.5%% of the short side, occlusion, clutter, ~6%% empty, ~10%% grey, ~10%% "
        "PNG). task=segment|pose|obb|classify (shapes style): polygons, quadrilaterals with their corners as "
        "keypoints, rotated boxes, a folder per class. Options: images=N (train; val gets N/5) imgsz=S classes=K "
        "(1-8) seed=N max_objects=N style=S task=T.",
    )
    s.add_argument("out_dir")
    s.add_argument("options", nargs="*", metavar="key=value")
    s.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from yolo_ray.config import parse_overrides
    from yolo_ray.data.synth import SynthSpec, generate

    opts = parse_overrides(ns.options, source="yolo-ray data synth")
    unknown = set(opts) - {"images", "imgsz", "classes", "seed", "max_objects", "style", "task"}
    if unknown:
        raise ConfigError(
            "yolo-ray data synth",
            ", ".join(sorted(unknown)),
            "unknown option.",
            "use images=N imgsz=S classes=K seed=N max_objects=N style=shapes|real task=segment|pose|obb|classify.",
        )
    try:
        spec = SynthSpec(**opts)
        spec.validate()
    except (TypeError, ValueError) as e:
        raise ConfigError("yolo-ray data synth", "options", str(e), "see `yolo-ray data synth --help`.") from None
    from yolo_ray.data.synth import dataset_path

    path = dataset_path(generate(ns.out_dir, spec), spec.task)  # data.path: a data.yaml, for classify the folder
    print(json.dumps({"data": str(path), "train_images": spec.images, "val_images": spec.val_images}))
    return 0

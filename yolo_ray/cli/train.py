"""`yolo-ray train`: train an experiment on Ray (local or a cluster), or with --native plain Ultralytics."""

from __future__ import annotations

import argparse
import json
from typing import Any

from yolo_ray.cli.common import VERBOSE_HELP, split_args, ultralytics_help


def add(sub: Any) -> None:
    t = sub.add_parser(
        "train",
        help="train an experiment on Ray (local or a cluster)",
        description="Train YOLO11 with DDP on Ray Train. CONFIG is an experiment YAML (default: the "
        "embedded smoke experiment); key=value pairs override it, e.g. train.epochs=5, or in Ultralytics' own "
        "words, e.g. epochs=5 imgsz=640 batch=64 data=coco.yaml device=0,1. " + ultralytics_help(),
    )
    t.add_argument("args", nargs="*", metavar="[CONFIG] key=value", help="experiment YAML and overrides")
    t.add_argument(
        "--native",
        action="store_true",
        help="train the same experiment with plain Ultralytics in this process (baseline, no Ray)",
    )
    t.add_argument(
        "--device",
        default=None,
        help="with --native: Ultralytics' device, e.g. cpu, 0, or 0,1 for its own DDP (default: from the config's "
        "scaling.use_gpu and scaling.num_workers: all local GPUs for auto)",
    )
    t.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    t.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from yolo_ray import config
    from yolo_ray.driver import launcher

    path, overrides = split_args(ns.args, ns.verbose)
    cfg = config.load(path, overrides)
    if ns.native:
        from yolo_ray.driver.native import native_device, train_native

        summary = train_native(cfg, device=ns.device or native_device(cfg))
        print(f"[yolo_ray] native Ultralytics: {json.dumps(summary['final'])}")
    else:
        summary = launcher.train(cfg)
    return 0 if summary.get("status") == "finished" else 1

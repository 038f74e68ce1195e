"""`yolo-ray check`: everything train and tune check before Ray starts, without training."""

from __future__ import annotations

import argparse
from typing import Any

from yolo_ray.cli.common import split_args


def add(sub: Any) -> None:
    c = sub.add_parser("check", help="validate an experiment config and its dataset, without training")
    c.add_argument("args", nargs="*", metavar="[CONFIG] key=value")
    c.add_argument("--no-data", action="store_true", help="check only the config, not the dataset or model")
    c.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    """Everything `train` and `tune` check before Ray starts: the config, the model, the dataset (every image and
    label), Ultralytics' arguments, the storage, the tracking server and alias, the sweep."""
    from yolo_ray import config, inputs
    from yolo_ray.driver import sweep_space
    from yolo_ray.tracking import mlflow_server

    path, overrides = split_args(ns.args)
    cfg = config.load(path, overrides)
    if not ns.no_data:
        checked = inputs.prepare(cfg)
        print(f"model: {checked.model}")
        print(checked.dataset.describe())
    if cfg.tracking.enabled:
        mlflow_server.check(cfg, mlflow_server.tracking_uri(cfg))
    if cfg.tune.space:
        sweep_space.check_space(cfg)
    print(f"{cfg.source}: OK")
    return 0

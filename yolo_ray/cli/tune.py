"""`yolo-ray tune`: a Ray Tune sweep of the config's `tune:` section."""

from __future__ import annotations

import argparse
from typing import Any

from yolo_ray.cli.common import VERBOSE_HELP, split_args


def add(sub: Any) -> None:
    u = sub.add_parser(
        "tune",
        help="run a Ray Tune sweep defined in the config's `tune:` section",
        description="Sweep training keys (batch, lr0, accumulate, ...) with Ray Tune: each trial is a "
        "yolo_ray training run reporting every epoch (ASHA stops weak ones). tune.resume=true "
        "continues an interrupted sweep.",
    )
    u.add_argument("args", nargs="*", metavar="[CONFIG] key=value")
    u.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    u.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from yolo_ray import config
    from yolo_ray.driver import sweep

    path, overrides = split_args(ns.args, ns.verbose)
    cfg = config.load(path, overrides)
    out = sweep.run(cfg)
    return 0 if out["best"] else 1

"""`yolo-ray promote`: the registry's `champion` alias moved to a model version if it is not worse."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from yolo_ray.cli.common import tracking_uri_option


def add(sub: Any) -> None:
    m = sub.add_parser("promote", help="move the `champion` alias to a model version if it is not worse")
    m.add_argument("name")
    m.add_argument("version")
    m.add_argument("--force", action="store_true", help="promote even if its mAP50-95 is worse")
    tracking_uri_option(m)
    m.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from yolo_ray.tracking import registry
    from yolo_ray.tracking.mlflow_server import resolve_uri

    try:
        print(registry.promote(ns.name, ns.version, resolve_uri(ns.tracking_uri), force=ns.force))
    except registry.PromotionRefused as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    return 0

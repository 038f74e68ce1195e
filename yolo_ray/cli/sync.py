"""`yolo-ray sync`: what MLflow missed during a server outage, sent for a run directory."""

from __future__ import annotations

import argparse
import json
from typing import Any

from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError


def add(sub: Any) -> None:
    y = sub.add_parser("sync", help="send what MLflow missed (server outage) for a run directory")
    y.add_argument("run_dir")
    y.add_argument("--wait", type=float, default=30.0, help="seconds to keep retrying a server that is down")
    y.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from yolo_ray import config
    from yolo_ray.tracking import mlflow_runs as tracking

    run_dir = Path(ns.run_dir).resolve()
    state_file = run_dir / tracking.STATE
    if not state_file.exists():
        raise ConfigError(
            str(run_dir),
            tracking.STATE,
            "this run directory has no MLflow run.",
            "pass a run directory of a run trained with tracking enabled.",
        )
    cfg = config.load(run_dir / layout.CONFIG)
    state = json.loads(state_file.read_text())
    summary_file = run_dir / layout.SUMMARY
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    tracker = tracking.Tracker(cfg, run_dir, state["tracking_uri"])
    info = tracker.finish(summary.get("status", "failed"), grace_s=ns.wait)
    print(json.dumps(info))
    return 1 if info.get("pending") else 0

"""`yolo-ray export`: weights exported to ONNX, TorchScript, ... from a run, checkpoint or registered model."""

from __future__ import annotations

import argparse
import json
from typing import Any

from yolo_ray.cli.common import tracking_uri_option


def add(sub: Any) -> None:
    e = sub.add_parser(
        "export",
        help="export weights to ONNX, TorchScript, ... (from a run, checkpoint or model)",
        description="SOURCE: a .pt, a run or checkpoint directory, an MLflow run id, or "
        "models:/NAME@ALIAS. Options: formats=onnx,torchscript imgsz=S out=DIR.",
    )
    e.add_argument("source")
    e.add_argument("options", nargs="*", metavar="key=value")
    tracking_uri_option(e)
    e.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from yolo_ray.config import parse_overrides
    from yolo_ray.tracking import registry
    from yolo_ray.tracking.export import export
    from yolo_ray.tracking.mlflow_server import resolve_uri

    opts = parse_overrides(ns.options, source="yolo-ray export")
    formats = [f.strip() for f in str(opts.get("formats", "onnx")).split(",") if f.strip()]
    uri = resolve_uri(ns.tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        weights = registry.resolve_weights(ns.source, uri, Path(tmp))
        imgsz = int(opts.get("imgsz") or trained_imgsz(weights))
        out = Path(opts.get("out") or Path("exports") / Path(ns.source.replace(":/", "_").replace("@", "_")).name)
        paths = export(weights, formats, imgsz, out.resolve())
    print(json.dumps(paths, indent=2))
    return 0


def trained_imgsz(weights) -> int:
    import torch

    ckpt = torch.load(weights, map_location="cpu", weights_only=False)
    return int((ckpt.get("train_args") or {}).get("imgsz", 640))

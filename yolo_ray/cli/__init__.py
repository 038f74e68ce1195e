"""`yolo-ray` command line: one module per command (train, tune, bench, check, data, submit, sync, export,
promote), each with its parser (`add`) and what it does (`run`); Ultralytics-style key=value overrides."""

from __future__ import annotations

import argparse
import sys
import textwrap

from yolo_ray import __version__
from yolo_ray.cli import bench, check, data, export, promote, submit, sync, train, tune
from yolo_ray.config import ConfigError

COMMANDS = (train, tune, bench, check, data, submit, sync, export, promote)

EXAMPLES = """
examples:
  yolo-ray train                                   # embedded default: local Ray, generated data, 2 CPU workers
  yolo-ray train experiments/smoke.yaml train.epochs=5 scaling.num_workers=2
  yolo-ray train model=yolo11s.yaml data=coco.yaml epochs=100 imgsz=640 batch=64 device=0,1   # Ultralytics' words
  yolo-ray check experiments/seed-coco-4gpu.yaml   # validate a config (and its dataset) without training
  yolo-ray data synth datasets/shapes images=2000 imgsz=640 classes=3
  yolo-ray data synth datasets/real style=real images=3000 imgsz=640 classes=5   # shaped like real data
  yolo-ray data synth datasets/seg task=segment images=512 imgsz=128        # then model=yolo11n-seg.yaml
  yolo-ray bench --parity seeds=0,1,2 epochs=10                                  # accuracy parity over seeds
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="yolo-ray",
        description="Train Ultralytics YOLO11 with DDP on Ray.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"yolo-ray {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except ConfigError as e:
        print("error: " + textwrap.fill(str(e), width=110, subsequent_indent="  "), file=sys.stderr)
        return 2

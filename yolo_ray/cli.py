"""`yolo-ray` command line: train, check and generate data, with Ultralytics-style key=value overrides."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from yolo_ray import __version__
from yolo_ray.config import ConfigError

EXAMPLES = """
examples:
  yolo-ray train                                   # embedded default: local Ray, generated data, 2 CPU workers
  yolo-ray train experiments/smoke.yaml train.epochs=5 scaling.num_workers=2
  yolo-ray check experiments/seed-coco-4gpu.yaml   # validate a config (and its dataset) without training
  yolo-ray data synth datasets/shapes images=2000 imgsz=640 classes=3
"""


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    """[CONFIG] key=value ... -> (config or None, overrides)."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def cmd_train(ns: argparse.Namespace) -> int:
    from yolo_ray import config, launcher

    path, overrides = _split(ns.args)
    cfg = config.load(path, overrides)
    summary = launcher.train(cfg)
    return 0 if summary.get("status") == "finished" else 1


def cmd_check(ns: argparse.Namespace) -> int:
    from yolo_ray import config, launcher

    path, overrides = _split(ns.args)
    cfg = config.load(path, overrides)
    if not ns.no_data:
        model, data_yaml = launcher.prepare(cfg)
        print(f"model: {model}\ndata: {data_yaml}")
    print(f"{cfg.source}: OK")
    return 0


def cmd_synth(ns: argparse.Namespace) -> int:
    from yolo_ray.config import parse_overrides
    from yolo_ray.data.synth import SynthSpec, generate

    opts = parse_overrides(ns.options, source="yolo-ray data synth")
    unknown = set(opts) - {"images", "imgsz", "classes", "seed", "max_objects"}
    if unknown:
        raise ConfigError("yolo-ray data synth", ", ".join(sorted(unknown)), "unknown option.",
                          "use images=N imgsz=S classes=K seed=N max_objects=N.")
    try:
        spec = SynthSpec(**opts)
        spec.validate()
    except (TypeError, ValueError) as e:
        raise ConfigError("yolo-ray data synth", "options", str(e), "see `yolo-ray data synth --help`.") from None
    path = generate(ns.out_dir, spec)
    print(json.dumps({"data_yaml": str(path), "train_images": spec.images, "val_images": spec.val_images}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="yolo-ray", description="Train Ultralytics YOLO11 with DDP on Ray.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"yolo-ray {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train an experiment on Ray (local or a cluster)",
                       description="Train YOLO11 with DDP on Ray Train. CONFIG is an experiment YAML (default: the "
                       "embedded smoke experiment); key=value pairs override it, e.g. train.epochs=5.")
    t.add_argument("args", nargs="*", metavar="[CONFIG] key=value", help="experiment YAML and overrides")
    t.set_defaults(func=cmd_train)

    c = sub.add_parser("check", help="validate an experiment config and its dataset, without training")
    c.add_argument("args", nargs="*", metavar="[CONFIG] key=value")
    c.add_argument("--no-data", action="store_true", help="check only the config, not the dataset or model")
    c.set_defaults(func=cmd_check)

    d = sub.add_parser("data", help="dataset tools").add_subparsers(dest="data_command", required=True)
    s = d.add_parser("synth", help="write a generated shapes dataset (YOLO format, train/val, data.yaml)",
                     description="Write a learnable detection dataset of shapes on textured backgrounds. Options: "
                     "images=N (train; val gets N/5) imgsz=S classes=K (1-8) seed=N max_objects=N.")
    s.add_argument("out_dir")
    s.add_argument("options", nargs="*", metavar="key=value")
    s.set_defaults(func=cmd_synth)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except ConfigError as e:
        print("error: " + textwrap.fill(str(e), width=110, subsequent_indent="  "), file=sys.stderr)
        return 2

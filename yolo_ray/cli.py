"""`yolo-ray` command line: train, check and generate data, with Ultralytics-style key=value overrides."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from typing import Any

from yolo_ray import __version__
from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError

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


VERBOSE_HELP = (
    "also show Ray's and Ultralytics' own output (start-up, model tables, per-batch bars, validation tables); "
    "by default one line per epoch, and a progress bar on a terminal (run.verbose=true)"
)


def _ultralytics_help() -> str:
    from yolo_ray.ultralytics_keys import help_text

    return help_text()


def _split(args: list[str], verbose: bool = False) -> tuple[str | None, list[str]]:
    """[CONFIG] key=value ... -> (config or None, overrides); --verbose is the override run.verbose=true."""
    path, overrides = (args[0], args[1:]) if args and "=" not in args[0] else (None, list(args))
    return path, [*overrides, "run.verbose=true"] if verbose else overrides


def cmd_train(ns: argparse.Namespace) -> int:
    from yolo_ray import config
    from yolo_ray.driver import launcher

    path, overrides = _split(ns.args, ns.verbose)
    cfg = config.load(path, overrides)
    if ns.native:
        from yolo_ray.driver.native import native_device, train_native

        summary = train_native(cfg, device=ns.device or native_device(cfg))
        print(f"[yolo_ray] native Ultralytics: {json.dumps(summary['final'])}")
    else:
        summary = launcher.train(cfg)
    return 0 if summary.get("status") == "finished" else 1


def cmd_tune(ns: argparse.Namespace) -> int:
    from yolo_ray import config
    from yolo_ray.driver import sweep

    path, overrides = _split(ns.args, ns.verbose)
    cfg = config.load(path, overrides)
    out = sweep.run(cfg)
    return 0 if out["best"] else 1


def cmd_bench(ns: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from yolo_ray.bench import parity
    from yolo_ray.bench import throughput as bench
    from yolo_ray.bench.variant_run import BenchSettings
    from yolo_ray.config import parse_overrides

    kind = parity.ParitySettings if ns.parity else BenchSettings
    settings = kind.cpu() if ns.cpu else kind()
    source = "yolo-ray bench --parity" if ns.parity else "yolo-ray bench"
    opts = parse_overrides(ns.options, source=source)
    known = {f.name for f in dataclasses.fields(settings)}
    if set(opts) - known:
        raise ConfigError(
            source,
            ", ".join(sorted(set(opts) - known)),
            "unknown option.",
            f"use any of: {', '.join(sorted(known))}.",
        )
    settings = dataclasses.replace(settings, **opts)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{'parity-' if ns.parity else ''}{'cpu' if ns.cpu else 'gpu'}"
    out = Path(ns.out or f"benchmarks/results/{stem}.json")
    (parity if ns.parity else bench).run(settings, ns.cpu, out)
    return 0


def cmd_check(ns: argparse.Namespace) -> int:
    """Everything `train` and `tune` check before Ray starts: the config, the model, the dataset (every image and
    label), Ultralytics' arguments, the storage, the tracking server and alias, the sweep."""
    from yolo_ray import config, inputs
    from yolo_ray.driver import sweep_space
    from yolo_ray.tracking import mlflow_server

    path, overrides = _split(ns.args)
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


def cmd_synth(ns: argparse.Namespace) -> int:
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


def cmd_sync(ns: argparse.Namespace) -> int:
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


def cmd_export(ns: argparse.Namespace) -> int:
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
        imgsz = int(opts.get("imgsz") or _trained_imgsz(weights))
        out = Path(opts.get("out") or Path("exports") / Path(ns.source.replace(":/", "_").replace("@", "_")).name)
        paths = export(weights, formats, imgsz, out.resolve())
    print(json.dumps(paths, indent=2))
    return 0


def _trained_imgsz(weights) -> int:
    import torch

    ckpt = torch.load(weights, map_location="cpu", weights_only=False)
    return int((ckpt.get("train_args") or {}).get("imgsz", 640))


def cmd_promote(ns: argparse.Namespace) -> int:
    from yolo_ray.tracking import registry
    from yolo_ray.tracking.mlflow_server import resolve_uri

    try:
        print(registry.promote(ns.name, ns.version, resolve_uri(ns.tracking_uri), force=ns.force))
    except registry.PromotionRefused as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_submit(ns: argparse.Namespace) -> int:
    from yolo_ray import config
    from yolo_ray.driver.submit import submit

    path, overrides = _split(ns.args, ns.verbose)
    cfg = config.load(path, overrides)  # bad input fails here, before anything reaches the cluster
    command = "tune" if ns.tune else "train"
    return submit(ns.address, command, cfg, path, overrides, wait=not ns.no_wait, working_dir=ns.working_dir)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="yolo-ray",
        description="Train Ultralytics YOLO11 with DDP on Ray.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"yolo-ray {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_tune, _add_bench, _add_check, _add_data, _add_submit, _add_sync, _add_export,
                _add_promote):  # fmt: skip
        add(sub)
    return p


def _tracking_uri(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI, else runs/mlflow.db")


def _add_train(sub: Any) -> None:
    t = sub.add_parser(
        "train",
        help="train an experiment on Ray (local or a cluster)",
        description="Train YOLO11 with DDP on Ray Train. CONFIG is an experiment YAML (default: the "
        "embedded smoke experiment); key=value pairs override it, e.g. train.epochs=5, or in Ultralytics' own "
        "words, e.g. epochs=5 imgsz=640 batch=64 data=coco.yaml device=0,1. " + _ultralytics_help(),
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
    t.set_defaults(func=cmd_train)


def _add_tune(sub: Any) -> None:
    u = sub.add_parser(
        "tune",
        help="run a Ray Tune sweep defined in the config's `tune:` section",
        description="Sweep training keys (batch, lr0, accumulate, ...) with Ray Tune: each trial is a "
        "yolo_ray training run reporting every epoch (ASHA stops weak ones). tune.resume=true "
        "continues an interrupted sweep.",
    )
    u.add_argument("args", nargs="*", metavar="[CONFIG] key=value")
    u.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    u.set_defaults(func=cmd_tune)


def _add_bench(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="benchmark native Ultralytics vs yolo_ray side by side (table + JSON)",
        description="On this machine, same data and settings: native Ultralytics on 1 device and its "
        "DDP on all; yolo_ray with 1 and N workers, with Ultralytics' loader and with its device path (also in "
        "throughput mode); the GPU-only step ceiling; optionally time-to-accuracy. Options: model= imgsz= images= "
        "epochs= batch_per_gpu= throughput_batch_per_gpu= workers= cache= amp= gpus= gpu_counts= only= tta_epochs= "
        "tta_factor= tta_batch_per_gpu=. With --parity: every path (native, ultralytics, device, graphs, "
        "throughput) over several seeds on real-shaped data, scored by Ultralytics and by pycocotools; options "
        "model= imgsz= images= classes= epochs=10,30 seeds=0,1,2 paths= batch_per_gpu= close_mosaic= workers= "
        "runs=graphs-e30-s1,... (named runs; none: no run) parallel=N (runs at once) merge=FILE[:path+path],... "
        "(earlier results join the table; missing runs are run).",
    )
    b.add_argument("options", nargs="*", metavar="key=value")
    b.add_argument("--cpu", action="store_true", help="a tiny CPU configuration (CI): proves it runs, no targets")
    b.add_argument("--parity", action="store_true", help="accuracy parity over seeds on real-shaped data")
    b.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/<time>-<cpu|gpu>.json)")
    b.set_defaults(func=cmd_bench)


def _add_check(sub: Any) -> None:
    c = sub.add_parser("check", help="validate an experiment config and its dataset, without training")
    c.add_argument("args", nargs="*", metavar="[CONFIG] key=value")
    c.add_argument("--no-data", action="store_true", help="check only the config, not the dataset or model")
    c.set_defaults(func=cmd_check)


def _add_data(sub: Any) -> None:
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
    s.set_defaults(func=cmd_synth)


def _add_submit(sub: Any) -> None:
    j = sub.add_parser(
        "submit",
        help="submit a train (or --tune) run to a Ray cluster as a job and follow it",
        description="Validates the config here, uploads the working dir (minus .rayignore), runs "
        "`yolo-ray train CONFIG ...` on the cluster, streams its logs and exits with its outcome.",
    )
    j.add_argument("args", nargs="*", metavar="[CONFIG] key=value")
    j.add_argument(
        "--address",
        default=os.environ.get("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:8265"),
        help="the cluster's dashboard/jobs address (default: RAY_API_SERVER_ADDRESS or local)",
    )
    j.add_argument("--tune", action="store_true", help="submit `yolo-ray tune` instead of train")
    j.add_argument("--no-wait", action="store_true", help="print the submission id and return")
    j.add_argument("--working-dir", default=".", help="uploaded as the job's working dir (default: .)")
    j.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    j.set_defaults(func=cmd_submit)


def _add_sync(sub: Any) -> None:
    y = sub.add_parser("sync", help="send what MLflow missed (server outage) for a run directory")
    y.add_argument("run_dir")
    y.add_argument("--wait", type=float, default=30.0, help="seconds to keep retrying a server that is down")
    y.set_defaults(func=cmd_sync)


def _add_export(sub: Any) -> None:
    e = sub.add_parser(
        "export",
        help="export weights to ONNX, TorchScript, ... (from a run, checkpoint or model)",
        description="SOURCE: a .pt, a run or checkpoint directory, an MLflow run id, or "
        "models:/NAME@ALIAS. Options: formats=onnx,torchscript imgsz=S out=DIR.",
    )
    e.add_argument("source")
    e.add_argument("options", nargs="*", metavar="key=value")
    _tracking_uri(e)
    e.set_defaults(func=cmd_export)


def _add_promote(sub: Any) -> None:
    m = sub.add_parser("promote", help="move the `champion` alias to a model version if it is not worse")
    m.add_argument("name")
    m.add_argument("version")
    m.add_argument("--force", action="store_true", help="promote even if its mAP50-95 is worse")
    _tracking_uri(m)
    m.set_defaults(func=cmd_promote)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except ConfigError as e:
        print("error: " + textwrap.fill(str(e), width=110, subsequent_indent="  "), file=sys.stderr)
        return 2

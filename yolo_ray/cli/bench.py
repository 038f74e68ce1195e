"""`yolo-ray bench`: benchmarks: speed side by side, or --parity: accuracy over seeds."""

from __future__ import annotations

import argparse
import time
from typing import Any

from yolo_ray.config import ConfigError


def add(sub: Any) -> None:
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
        "(earlier results join the table; missing runs are run) overrides='KEY=VALUE ...' label=NAME (a variant of "
        "every run: path.NAME-eE-sS).",
    )
    b.add_argument("options", nargs="*", metavar="key=value")
    b.add_argument("--cpu", action="store_true", help="a tiny CPU configuration (CI): proves it runs, no targets")
    b.add_argument("--parity", action="store_true", help="accuracy parity over seeds on real-shaped data")
    b.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/<time>-<cpu|gpu>.json)")
    b.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
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

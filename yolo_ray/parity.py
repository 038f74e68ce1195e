"""`yolo-ray bench --parity`: does each yolo_ray path train as well as native Ultralytics on real-shaped data?

Every path trains the same experiment (the generated `real`-style scenes, the same model, epochs, global batch and
close_mosaic) over several seeds, through its real entry point in a subprocess; each run's final weights are then
scored twice on the val split, by Ultralytics' validator and by pycocotools (coco_eval.py), with COCO's AP for small,
medium and large objects. The table gives per path the mean and spread over seeds, the difference from native's
mean, training time (the batch loops) and wall clock (start-up and validation included). One run's difference is not
evidence: native's own seed-to-seed spread on such data is a few points of mAP50-95.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from yolo_ray import coco_eval, gitinfo
from yolo_ray.bench import GRAPHS, BenchSettings, device_path, run_variant, throughput_lr0
from yolo_ray.config import ConfigError
from yolo_ray.summary import read_history, read_jsonl

PATHS = ("native", "ultralytics", "device", "graphs", "throughput")
PARITY_POINTS = 0.005  # a path is at parity when its mean mAP50-95 >= native's mean - this


@dataclass
class ParitySettings:
    model: str = "yolo11n.yaml"
    imgsz: int = 640
    images: int = 3000  # train split; val gets a fifth
    classes: int = 5
    data_seed: int = 0
    epochs: str = "10"  # comma-separated: each path trains to each of these, e.g. "10,30"
    seeds: str = "0,1,2"
    paths: str = ",".join(PATHS)
    batch_per_gpu: int = 64
    throughput_batch_per_gpu: int = 256
    close_mosaic: int = 3
    workers: int = 8  # loader processes (native and Ultralytics' loader)
    deterministic: bool = True
    data_dir: str = "datasets/parity"
    out_dir: str = "benchmarks/runs-parity"

    @classmethod
    def cpu(cls) -> ParitySettings:
        """Toy size for CI: proves the benchmark and both scorers run end to end; sets no targets."""
        return cls(
            imgsz=128,
            images=48,
            classes=3,
            epochs="2",
            seeds="0,1",
            paths="native,ultralytics,device",
            batch_per_gpu=8,
            close_mosaic=1,
            workers=0,
            data_dir="datasets/parity-cpu",
            out_dir="benchmarks/runs-parity-cpu",
        )

    def listed(self, key: str) -> list[str]:
        return [x.strip() for x in str(getattr(self, key)).split(",") if x.strip()]


def plan(p: ParitySettings, cpu: bool) -> list[tuple[str, int, int, list[str], int]]:
    """(path, epochs, seed, CLI args, images per device) of every run, paths interleaved within a seed so that a
    drift of the shared host over the call does not fall on one path."""
    paths = p.listed("paths")
    bad = [x for x in paths if x not in PATHS or (cpu and x in ("graphs", "throughput"))]
    if bad:
        allowed = "native, ultralytics, device" if cpu else ", ".join(PATHS)
        raise ConfigError(
            "yolo-ray bench --parity", "paths", f"unknown or not on this device: {bad}.", f"use {allowed}."
        )
    use = [f"scaling.use_gpu={str(not cpu).lower()}"]
    fast = [] if cpu else ["train.channels_last=true"]
    args = {
        "native": ["--native", "--device", "cpu" if cpu else "0"],
        "ultralytics": [*use, *fast],
        "device": [*use, *device_path(BenchSettings())],
        "graphs": [*use, *device_path(BenchSettings()), *GRAPHS],
        "throughput": [*use, *device_path(BenchSettings()), *GRAPHS],
    }
    out = []
    for epochs in (int(e) for e in p.listed("epochs")):
        for seed in (int(s) for s in p.listed("seeds")):
            for path in paths:
                batch = p.throughput_batch_per_gpu if path == "throughput" else p.batch_per_gpu
                extra = [f"train.lr0={throughput_lr0(batch)}"] if path == "throughput" else []
                out.append((path, epochs, seed, [*args[path], *extra], batch))
    return out


def _overrides(p: ParitySettings, name: str, epochs: int, seed: int, batch: int) -> list[str]:
    cpus = max(1, (os.cpu_count() or 1) - 1)
    return [
        f"model={p.model}",
        "data.path=synthetic",
        f"data.dir={p.data_dir}",
        "data.synthetic.style=real",
        f"data.synthetic.images={p.images}",
        f"data.synthetic.imgsz={p.imgsz}",
        f"data.synthetic.classes={p.classes}",
        f"data.synthetic.seed={p.data_seed}",
        f"train.imgsz={p.imgsz}",
        f"train.epochs={epochs}",
        f"train.batch={batch}",
        "train.accumulate=1",
        f"train.workers={p.workers}",
        f"train.seed={seed}",
        f"train.deterministic={str(p.deterministic).lower()}",
        "train.val=false",  # validated once, at the last epoch: the scorers below judge the final weights
        "train.plots=false",
        f"train.close_mosaic={p.close_mosaic}",
        "tracking.enabled=false",
        "scaling.num_workers=1",
        f"scaling.cpus_per_worker={cpus}",
        f"run.storage_path={p.out_dir}",
        f"run.name={name}",
    ]


def training_seconds(run_dir: Path) -> float | None:
    """The batch loops' seconds over all epochs: yolo_ray's history.jsonl, or native's epoch timer."""
    native = run_dir / "native_epochs.jsonl"
    if native.exists():
        return round(sum(r["train_s"] for r in read_jsonl(native)), 2)
    rows = read_history(run_dir)
    return round(sum(r["train_time_s"] for r in rows), 2) if rows else None


def run_one(
    p: ParitySettings, data_yaml: Path, gt: dict[str, Any], entry: tuple, cpu: bool, env: dict[str, str]
) -> dict[str, Any]:
    path, epochs, seed, args, batch = entry
    name = f"{path}-e{epochs}-s{seed}"
    bench = BenchSettings(images=p.images, out_dir=p.out_dir)
    row = run_variant(bench, name, [*args, *_overrides(p, name, epochs, seed, batch)], 1, env, batch)
    out: dict[str, Any] = {"path": path, "epochs": epochs, "seed": seed, "batch_per_gpu": batch, "name": name}
    if "error" in row:
        return {**out, "error": row["error"]}
    run_dir = Path(p.out_dir).resolve() / name
    weights, device = run_dir / "train" / "weights" / "last.pt", "cpu" if cpu else "0"
    scores = coco_eval.score(weights, data_yaml, p.imgsz, device, run_dir / "score", gt)
    return {
        **out,
        **scores,
        "results_csv_mAP50-95": row["mAP50-95"],
        "train_s": training_seconds(run_dir),
        "wall_s": row["wall_s"],
        "images_per_s": row["images_per_s"],
        "loop_images_per_s": row.get("loop_images_per_s"),
    }


def _spread(values: list[float | None]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "mean": round(statistics.mean(values), 5),
        "std": round(statistics.stdev(values), 5) if len(values) > 1 else 0.0,
        "min": round(min(values), 5),
        "max": round(max(values), 5),
    }


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (path, epochs): mean and spread over seeds of each score, and the difference from native's mean."""
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        if "error" not in r:
            groups.setdefault((r["path"], r["epochs"]), []).append(r)
    for (path, epochs), runs in groups.items():
        row: dict[str, Any] = {"path": path, "epochs": epochs, "seeds": [r["seed"] for r in runs]}
        row["mAP50-95"] = _spread([r["ultralytics"]["mAP50-95"] for r in runs])
        row["mAP50"] = _spread([r["ultralytics"]["mAP50"] for r in runs])
        for key in ("AP", "AP_small", "AP_medium", "AP_large"):
            row[f"coco_{key}"] = _spread([r["coco"][key] for r in runs])
        row["scorers_differ_by_max"] = max(r["scorers_differ_by"] for r in runs)
        for key in ("train_s", "wall_s", "loop_images_per_s"):
            values = [r[key] for r in runs if r.get(key) is not None]
            row[key] = round(statistics.mean(values), 2) if values else None
        rows.append(row)
    for row in rows:
        native = next((n for n in rows if n["path"] == "native" and n["epochs"] == row["epochs"]), None)
        if native and row["path"] != "native":
            delta = row["mAP50-95"]["mean"] - native["mAP50-95"]["mean"]
            row["vs_native_mAP50-95"] = round(delta, 5)
            row["at_parity"] = delta >= -PARITY_POINTS
            if row["train_s"] and native["train_s"]:
                row["train_speedup"] = round(native["train_s"] / row["train_s"], 2)
            row["wall_speedup"] = round(native["wall_s"] / row["wall_s"], 2)
    return rows


def run(p: ParitySettings, cpu: bool, out_json: Path) -> dict[str, Any]:
    import torch

    from yolo_ray.data.synth import SynthSpec, ensure

    entries = plan(p, cpu)  # bad options fail here, before any data or GPU work
    spec = SynthSpec(images=p.images, imgsz=p.imgsz, classes=p.classes, seed=p.data_seed, style="real")
    data_yaml = ensure(p.data_dir, spec)
    Path(p.out_dir).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"), "YOLO_OFFLINE": "1"}
    report: dict[str, Any] = {
        "kind": "parity",
        "machine": platform.node(),
        "gpu_name": None if cpu else torch.cuda.get_device_name(0),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": os.environ.get("YOLO_RAY_COMMIT") or gitinfo.commit(Path(__file__).parent),
        "settings": asdict(p),
        "results": [],
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    gt = coco_eval.ground_truth(data_yaml)  # one val split for every run: built once
    for entry in entries:
        report["results"].append(run_one(p, data_yaml, gt, entry, cpu, env))
        report["summary"] = summarize(report["results"])
        out_json.write_text(json.dumps(report, indent=2))  # partial results survive a call cut short
    print_table(report)
    print(f"\nwritten: {out_json}")
    return report


def print_table(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(
        f"\nparity on real-shaped data: {s['model']} @ {s['imgsz']} px, {s['images']} train images, "
        f"seeds {s['seeds']}, {report['gpu_name'] or 'CPU'}"
    )
    cols = ["path", "epochs", "mAP50-95", "vs native", "mAP50", "coco AP", "AP_small", "AP_medium", "AP_large"]
    cols += ["train_s", "wall_s", "scorers differ"]
    print(" | ".join(c.ljust(15) for c in cols))

    def ms(d: dict[str, float] | None) -> str:
        return f"{d['mean']:.4f}±{d['std']:.4f}" if d else "-"

    for r in report.get("summary", []):
        scores = [
            ms(r[k]) for k in ("mAP50-95", "mAP50", "coco_AP", "coco_AP_small", "coco_AP_medium", "coco_AP_large")
        ]
        cells = [r["path"], str(r["epochs"]), scores[0], f"{r.get('vs_native_mAP50-95', 0):+.4f}", *scores[1:]]
        cells += [str(r["train_s"]), str(r["wall_s"]), f"{r['scorers_differ_by_max']:.5f}"]
        print(" | ".join(c.ljust(15) for c in cells))
    for r in report["results"]:
        if "error" in r:
            print(f"ERROR {r['name']}: {r['error'][-400:]}")

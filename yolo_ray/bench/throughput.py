"""`yolo-ray bench`: native Ultralytics vs yolo_ray on the same machine, data and settings, in one run.

Every variant trains through its real entry point in a subprocess (variant_run.py) with validation off until the
last epoch, so the gaps between Ultralytics' results.csv rows are training time; steady state drops the first epoch.
Beside them, the GPU-only ceiling (step_ceiling.py) and, optionally, time to accuracy (time_to_accuracy.py). Prints a
table, writes JSON.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from yolo_ray import gitinfo, tasks
from yolo_ray.bench import environment
from yolo_ray.bench.step_ceiling import step_ceiling
from yolo_ray.bench.time_to_accuracy import time_to_accuracy
from yolo_ray.bench.variant_run import GRAPHS, BenchSettings, device_path, overrides, run_variant
from yolo_ray.config import ConfigError


def device_counts(s: BenchSettings, n_all: int) -> list[int]:
    """The device counts every variant runs on: 1 and all, or gpu_counts (a scaling curve, e.g. 1,2,4)."""
    if not s.gpu_counts:
        return sorted({1, n_all})
    counts = sorted({int(x) for x in str(s.gpu_counts).split(",") if x})
    if not counts or counts[0] < 1 or counts[-1] > n_all:
        raise ConfigError(
            "yolo-ray bench", "gpu_counts", f"{s.gpu_counts} must lie in 1..{n_all} (the devices here).", "lower it."
        )
    return counts


def plan(s: BenchSettings, gpus: int, cpu: bool) -> list[tuple[str, list[str], int, int]]:
    """(name, CLI args, devices, images per device) of every variant: native, yolo_ray with Ultralytics' loader,
    yolo_ray's device path at native settings and in throughput mode; on 1 device and on all of them (or gpu_counts)."""
    unit, n_all = ("cpu", 2) if cpu else ("gpu", gpus)
    counts = device_counts(s, n_all)
    use = ["scaling.use_gpu=false"] if cpu else ["scaling.use_gpu=true"]
    out = [(f"native-1{unit}", ["--native", "--device", "cpu" if cpu else "0"], 1, s.batch_per_gpu)]
    for n in [] if cpu else counts[1:]:
        devices = ",".join(map(str, range(n)))
        out.append((f"native-ddp-{n}{unit}", ["--native", "--device", devices], n, s.batch_per_gpu))
    once = [n_all] if cpu else counts  # CI: each yolo_ray path once, on 2 CPU workers
    for n in once:
        out.append((f"yolo_ray-{n}{unit}", use, n, s.batch_per_gpu))
    for n in once:
        out.append((f"yolo_ray-device-{n}{unit}", [*use, *device_path(s)], n, s.batch_per_gpu))
    if not cpu:
        for n in counts:
            out.append((f"yolo_ray-graphs-{n}{unit}", [*use, *device_path(s), *GRAPHS], n, s.batch_per_gpu))
    task = tasks.get(s.task)  # the fast path's parts this task has (inputs.check_task_paths refuses the others)
    out = [v for v in out if task.device_loader or "device" not in v[0]]
    out = [v for v in out if task.cuda_graphs or "graphs" not in v[0]]
    if s.throughput_batch_per_gpu and s.task == "detect":
        tb = s.throughput_batch_per_gpu
        for n in counts:
            out.append((f"yolo_ray-device-b{tb}-{n}{unit}", [*use, *device_path(s)], n, tb))
        for n in [] if cpu else counts:
            out.append((f"yolo_ray-graphs-b{tb}-{n}{unit}", [*use, *device_path(s), *GRAPHS], n, tb))
    only = {x for x in s.only.split(",") if x}
    return [v for v in out if not only or v[0] in only]


def run(s: BenchSettings, cpu: bool, out_json: Path) -> dict[str, Any]:
    import torch

    from yolo_ray.data.synth import SynthSpec, ensure

    s = s.for_task()
    gpus = 0 if cpu else (s.gpus or torch.cuda.device_count())
    variants = plan(s, gpus, cpu)  # bad options fail here, before any data or GPU work
    ensure(s.data_dir, SynthSpec(images=s.images, imgsz=s.imgsz, classes=s.classes, style=s.style, task=s.task))
    Path(s.out_dir).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"), "YOLO_OFFLINE": "1"}
    results: list[dict[str, Any]] = []
    report = {
        "machine": platform.node(),
        "kind": os.environ.get("YOLO_RAY_BENCH_KIND", "local"),
        "gpus": gpus,
        "gpu_name": torch.cuda.get_device_name(0) if gpus else None,
        "cpus": os.cpu_count(),
        "uncompiled_packages": environment.check(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **gitinfo.provenance(Path(__file__).parent),
        "settings": asdict(s),
        "results": results,
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    ceilings = {s.batch_per_gpu, s.throughput_batch_per_gpu} - {0} if s.task == "detect" else set()
    for batch in sorted(ceilings):  # first: short, and a reference (of the detection model's step)
        results.append(step_ceiling(s, "cpu" if cpu else "cuda:0", batch))
        if not cpu:  # graphs; and both steps under the variants' kernel mode (train.deterministic)
            mode = "deterministic" if s.deterministic else "autotuned"
            results.append(step_ceiling(s, "cuda:0", batch, graphs=True))
            results.append(step_ceiling(s, "cuda:0", batch, mode=mode))
            results.append(step_ceiling(s, "cuda:0", batch, graphs=True, mode=mode))
    if not cpu:
        gc.collect()  # the ceilings' models and graphs, then their cached blocks
        torch.cuda.empty_cache()  # the variants run in their own processes: give them this one's cached memory
    for name, args, n, batch in variants:
        profile = [f"run.profile_steps={s.profile_steps}"] if s.profile_steps and name.startswith("yolo_ray") else []
        results.append(run_variant(s, name, [*args, *overrides(s, name, n, batch), *profile], n, env, batch))
        out_json.write_text(json.dumps(report, indent=2))  # partial results survive a run cut short
    _derive(report)
    if s.tta_epochs:
        report["time_to_accuracy"] = time_to_accuracy(s, max(gpus, 1), cpu, env)
    out_json.write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"\nwritten: {out_json}")
    return report


def _derive(report: dict[str, Any]) -> None:
    """Ratios: scaling vs the same variant on one device, yolo_ray vs native at equal devices, vs the step ceiling
    at the same images per device."""
    rows = {r["name"]: r for r in report["results"] if "images_per_s" in r}
    # the eager step is the reference the targets are set against
    ceilings = {r["batch_per_gpu"]: r["images_per_s"] for r in rows.values() if "step-ceiling-b" in r["name"]}
    unit = "cpu" if report["gpus"] == 0 else "gpu"
    for r in rows.values():
        if "step-ceiling" in r["name"]:
            continue
        tool, n = r["name"].rsplit("-", 1)[0], r["gpus"]
        single = rows.get("native-1" + unit if tool.startswith("native") else f"{tool}-1{unit}")
        if single and n > 1:
            r["speedup_vs_1"] = round(r["images_per_s"] / single["images_per_s"], 3)
            r["scaling_efficiency"] = round(r["speedup_vs_1"] / n, 3)
        if tool.startswith("yolo_ray"):
            native = rows.get(f"native-1{unit}" if n == 1 else f"native-ddp-{n}{unit}")
            if native:
                r["ratio_vs_native"] = round(r["images_per_s"] / native["images_per_s"], 3)
        ceiling = ceilings.get(r.get("batch_per_gpu"))
        if ceiling:
            r["fraction_of_ceiling_per_device"] = round(r["images_per_s"] / n / ceiling, 3)


def print_table(report: dict[str, Any]) -> None:
    cols = [
        "name",
        "gpus",
        "batch_per_gpu",
        "images_per_s",
        "loop_images_per_s",
        "epoch_s",
        "save_s",
        "report_s",
        "checkpoint_write_s",
        "speedup_vs_1",
        "scaling_efficiency",
        "ratio_vs_native",
        "fraction_of_ceiling_per_device",
        "peak_gpu_mem_gib",
        "cpu_util_pct",
        "gpu_util_pct",
        "mAP50-95",
        "mask_mAP50-95",
        "pose_mAP50-95",
        "top1",
    ]
    print(
        f"\n{report['gpus']} x {report['gpu_name'] or 'CPU'}, {report['cpus']} CPUs, {report['settings']['model']} "
        f"@ {report['settings']['imgsz']} px, {report['settings']['batch_per_gpu']} images per device"
    )
    print(" | ".join(c[:14].ljust(14) for c in cols))
    for r in report["results"]:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append((f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v)))[:14].ljust(14))
        print(" | ".join(cells) + (f"  ERROR: {r['error'][-300:]}" if "error" in r else ""))
    if "time_to_accuracy" in report:
        print("\ntime to accuracy: " + json.dumps(report["time_to_accuracy"]))

"""Time to accuracy: native Ultralytics sets a target mAP50-95; yolo_ray's throughput mode must reach it sooner."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from yolo_ray import run_layout as layout
from yolo_ray.bench.variant_run import (
    GRAPHS,
    BenchSettings,
    device_path,
    overrides,
    results_csv,
    run_variant,
    throughput_lr0,
)
from yolo_ray.summary import read_history, read_jsonl


def time_to_accuracy(s: BenchSettings, gpus: int, cpu: bool, env: dict[str, str]) -> dict[str, Any]:
    """Native Ultralytics (1 device, batch_per_gpu, tta_epochs, validating every epoch) sets the target: its final
    mAP50-95. yolo_ray's throughput mode (all devices, each of tta_batch_per_gpu, linear LR rule, its fastest path,
    up to tta_factor x tta_epochs epochs, validating every epoch) must reach it in less time."""
    unit = "cpu" if cpu else "gpu"
    tta = BenchSettings(**{**asdict(s), "epochs": s.tta_epochs})
    native_name = f"tta-native-1{unit}"
    native_args = [
        "--native",
        "--device",
        "cpu" if cpu else "0",
        *overrides(tta, native_name, 1, s.batch_per_gpu, True),
    ]
    native = run_variant(tta, native_name, native_args, 1, env, s.batch_per_gpu)
    if "error" in native:
        return {"native": native}
    native_dir = Path(s.out_dir).resolve() / native_name
    native_rows = results_csv(native_dir)
    target = native_rows[-1]["metrics/mAP50-95(B)"]
    result: dict[str, Any] = {
        "target_mAP50-95": target,
        "native": {
            "epochs": s.tta_epochs,
            "global_batch": s.batch_per_gpu,
            "s_to_target": native_rows[-1]["time"],
            "loop_s_to_target": round(sum(r["train_s"] for r in read_jsonl(native_dir / layout.NATIVE_EPOCHS)), 2),
            "wall_s": native["wall_s"],
        },
        "yolo_ray": [],
    }
    ours_settings = BenchSettings(**{**asdict(s), "epochs": s.tta_factor * s.tta_epochs})
    fastest = device_path(s) if cpu else [*device_path(s), *GRAPHS]
    for tb in tta_batches(s):
        lr0 = throughput_lr0(tb * gpus)
        name = f"tta-yolo_ray-b{tb}-{gpus}{unit}"
        args = [*overrides(ours_settings, name, gpus, tb, True), *fastest, f"train.lr0={lr0}"]
        args.append(f"scaling.use_gpu={str(not cpu).lower()}")
        ours = run_variant(ours_settings, name, args, gpus, env, tb)
        run_dir = Path(s.out_dir).resolve() / name
        entry = {"batch_per_gpu": tb, "global_batch": tb * gpus, "lr0": lr0, "wall_s": ours["wall_s"]}
        if "error" in ours:
            entry["error"] = ours["error"]
        else:
            entry.update(reached(results_csv(run_dir), read_history(run_dir), target, result["native"]))
        result["yolo_ray"].append(entry)
    return result


def tta_batches(s: BenchSettings) -> list[int]:
    return [int(x) for x in str(s.tta_batch_per_gpu).split(",") if x] or [s.throughput_batch_per_gpu or s.batch_per_gpu]


def reached(
    csv_rows: list[dict[str, float]], history: list[dict[str, Any]], target: float, native: dict[str, Any]
) -> dict[str, Any]:
    """When a run first reached the target mAP50-95, in two clocks: results.csv's (training plus every epoch's
    validation, as the run went) and the batch loops' alone (validation, saving and reporting left out on both
    sides), each with its speedup over native's."""
    first = next((r for r in csv_rows if r["metrics/mAP50-95(B)"] >= target), None)
    out: dict[str, Any] = {
        "best_mAP50-95": max(r["metrics/mAP50-95(B)"] for r in csv_rows),
        "epoch_reached": None,
        "val_s_median": round(statistics.median(h["val_s"] for h in history), 2) if history else None,
    }
    if first is None:
        return out
    epoch = int(first["epoch"])
    loop_s = sum(h["train_time_s"] for h in history if h["epoch"] <= epoch)
    out.update(
        epoch_reached=epoch,
        s_to_target=round(first["time"], 2),
        loop_s_to_target=round(loop_s, 2),
        speedup=round(native["s_to_target"] / first["time"], 2),
        loop_speedup=round(native["loop_s_to_target"] / loop_s, 2),
    )
    return out

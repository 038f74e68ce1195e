"""One benchmark variant: its settings, its `yolo-ray train` (or `--native`) command line, run in a subprocess
with its output timestamped, and what its run directory says afterwards (steady images/s, phases, medians)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import IO, Any

from yolo_ray import tasks
from yolo_ray.bench.gpu_sampler import Sampler
from yolo_ray.console import TRAINING_STARTS
from yolo_ray.summary import read_history
from yolo_ray.tasks import RENAMES


@dataclass
class BenchSettings:
    model: str = "yolo11n.yaml"
    imgsz: int = 640
    images: int = 4096
    style: str = "real"  # the generated data: real-shaped scenes (data.synthetic.style), or `shapes`
    classes: int = 5
    epochs: int = 5
    batch_per_gpu: int = 64
    workers: int = 8  # loader processes per GPU (per Ray worker)
    cache: str = "false"
    amp: bool = True
    gpus: int = 0  # 0: all visible
    data_dir: str = "datasets/bench"
    out_dir: str = "benchmarks/runs"
    ceiling_steps: int = 30
    throughput_batch_per_gpu: int = 256  # throughput mode's images per device (0: skip it)
    only: str = ""  # comma-separated variant names to run (default: all)
    gpu_counts: str = ""  # comma-separated device counts each variant runs on, e.g. "1,2,4" (default: 1 and all)
    tta_epochs: int = 0  # > 0: also measure time-to-accuracy (native's final mAP50-95 after this many epochs)
    tta_factor: int = 3  # throughput mode may train up to tta_factor x tta_epochs epochs to reach it
    tta_batch_per_gpu: str = ""  # time-to-accuracy's images per device, e.g. "256,128" (default: throughput mode's)
    profile_steps: int = 0  # > 0: yolo_ray variants profile this many steps of epoch 2 (yolo_ray/worker/profiling.py)
    deterministic: bool = True  # every variant's train.deterministic (false: cuDNN autotuned, its fastest kernels)
    cpus_per_worker: float = 0  # yolo_ray's Ray workers (0: this machine's CPUs shared among them, as native has them)
    device_cache: str = "auto"  # the device-loader variants' data.device_cache: auto | replicated | sharded
    task: str = "detect"  # segment | pose | obb | classify: that task's model and generated data, native vs yolo_ray

    def for_task(self) -> BenchSettings:
        """The settings as a task other than detect runs them: its yolo11 model (unless one is given), its generated
        data (shapes style, at most 3 classes); the fast path's variants only where the task has them (tasks.py)."""
        if self.task == "detect":
            return self
        from dataclasses import replace

        model = self.model if self.model != "yolo11n.yaml" else f"yolo11n{tasks.get(self.task).model_suffix}.yaml"
        data_dir = f"{self.data_dir}-{self.task}"
        return replace(self, model=model, style="shapes", classes=min(self.classes, 3), data_dir=data_dir)

    @classmethod
    def cpu(cls) -> BenchSettings:
        """A tiny end-to-end configuration for CI: proves the benchmark runs, sets no targets."""
        return cls(
            imgsz=64,
            images=64,
            epochs=2,
            batch_per_gpu=8,
            workers=0,
            amp=False,
            ceiling_steps=3,
            throughput_batch_per_gpu=0,
            profile_steps=2,  # a 2-worker epoch here has 4 batches: 2 skipped, 2 profiled
            style="shapes",  # mechanics only: parity on real-shaped data is `--parity --cpu`
            classes=3,
            data_dir="datasets/bench-cpu",
            out_dir="benchmarks/runs-cpu",
        )


def results_csv(run_dir: Path) -> list[dict[str, float]]:
    import csv

    path = run_dir / "train" / "results.csv"
    with open(path) as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def steady_images_per_s(rows: list[dict[str, float]], images: int) -> tuple[float, float]:
    """(images/s, seconds per epoch) from results.csv's cumulative time column. A row is written mid-way through
    an epoch's end, so the first gap carries epoch 1's one-off costs (first checkpoint save and report); the last
    carries the final validation. Both are dropped when there are gaps left."""
    times = [r["time"] for r in rows]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    gaps = gaps[1:-1] or gaps[:-1] or [times[0]]
    epoch_s = statistics.median(gaps)
    return images / epoch_s, epoch_s


def history_medians(run_dir: Path) -> dict[str, float | None]:
    """yolo_ray only, from history.jsonl over epochs 2..n: the batch loop's own images/s (without the end-of-epoch
    work that images_per_s includes), and that work split: Ultralytics' (validation, CSV, the checkpoint snapshot:
    save_s) and yolo_ray's (epoch metrics, checkpoint hand-off to Ray: report_s); the writer thread's time per
    checkpoint, off the training thread (checkpoint_write_s); the batch loop's seconds (train_time_s) and the stream
    loader's stages in it (feed/*_s, data/feed_clock.py)."""
    rows = read_history(run_dir)
    rows = rows[1:] or rows

    def median(key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return round(statistics.median(values), 3) if values else None

    loop = median("images_per_s")
    feed = sorted({k for r in rows for k in r if k.startswith("feed/")})
    return {
        "loop_images_per_s": loop and round(loop, 1),
        **{k: median(k) for k in ("save_s", "report_s", "checkpoint_write_s", "train_time_s", *feed)},
    }


def overrides(
    s: BenchSettings, name: str, workers: int, batch_per_gpu: int, val_every_epoch: bool = False
) -> list[str]:
    return [
        f"model={s.model}",
        "data.path=synthetic",
        f"data.dir={s.data_dir}",
        f"data.synthetic.images={s.images}",
        f"data.synthetic.imgsz={s.imgsz}",
        f"data.synthetic.classes={s.classes}",
        f"data.synthetic.style={s.style}",
        f"train.imgsz={s.imgsz}",
        f"train.epochs={s.epochs}",
        f"train.batch={batch_per_gpu * workers}",
        "train.accumulate=1",
        f"train.workers={s.workers}",
        f"train.cache={s.cache}",
        f"train.amp={str(s.amp).lower()}",
        f"train.deterministic={str(s.deterministic).lower()}",
        f"train.val={str(val_every_epoch).lower()}",
        "train.plots=false",
        "train.close_mosaic=0",
        "tracking.enabled=false",
        f"scaling.num_workers={workers}",
        f"scaling.cpus_per_worker={s.cpus_per_worker or max(1, ((os.cpu_count() or 1) - 1) // workers)}",
        f"run.storage_path={s.out_dir}",
        f"run.name={name}",
    ]


def device_path(s: BenchSettings) -> list[str]:
    """yolo_ray's fast path: batches decoded and augmented on the device, channels_last model and inputs."""
    return ["data.loader=device", "train.channels_last=true", f"data.device_cache={s.device_cache}"]


GRAPHS = ["train.cuda_graphs=true"]  # and the model's forward/backward as CUDA graph replays (GPUs only)


def throughput_lr0(global_batch: int, lr0: float = 0.01, reference: int = 64) -> float:
    """Throughput mode's learning-rate rule: lr0 scales linearly with the global batch over Ultralytics' nominal 64
    (accumulate stays 1, so each large batch is one optimizer step; warmup keeps its epochs). Measured on the CPU
    analogue (smoke experiment, batch 16 -> 64, 30 epochs, mAP50-95): unscaled 0.417, sqrt 0.614, linear 0.729,
    twice linear 0.566; the base batch reached 0.796. On the parity data (H200, 256, 30 epochs, seed 0): lr0 0.01
    0.504, 0.02 0.515, 0.04 0.587, 0.08 0.521 (README, parity). Ultralytics clips every step there, so a step's length
    is lr0 x 10 and this rule keeps an epoch's distance."""
    return round(lr0 * global_batch / reference, 5)


def run_variant(
    s: BenchSettings, name: str, args: list[str], workers: int, env: dict[str, str], batch_per_gpu: int
) -> dict[str, Any]:
    run_dir = Path(s.out_dir).resolve() / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run: never a resumed or "already finished" one
    started = time.time()
    cmd = [sys.executable, "-m", "yolo_ray", "train", *args]
    log = Path(s.out_dir) / f"{name}.log"
    with Sampler(workers) as sampler, subprocess.Popen(cmd, env=env, stdout=PIPE, stderr=STDOUT, text=True) as proc:
        sampler.pid = proc.pid  # its GPU memory is this process tree's
        lines = timestamped(proc.stdout, started, log)
    wall = time.time() - started
    if proc.returncode != 0:
        return {"name": name, "error": "".join(line for _, line in lines)[-2000:], "gpus": workers}
    rows = results_csv(run_dir)
    ips, epoch_s = steady_images_per_s(rows, s.images)
    last = rows[-1]
    return {
        "name": name,
        "gpus": workers,
        "batch_per_gpu": batch_per_gpu,
        "images_per_s": round(ips, 1),
        **history_medians(run_dir),
        "profile": json.loads((run_dir / "profile.json").read_text()) if (run_dir / "profile.json").exists() else None,
        "epoch_s": round(epoch_s, 2),
        "wall_s": round(wall, 1),
        **phases(lines, wall),
        **{RENAMES[k]: v for k, v in last.items() if k in RENAMES},  # the task's scores: mAP50-95, top1, ...
        **sampler.summary(),
    }


def timestamped(stream: IO[str] | None, started: float, log: Path) -> list[tuple[float, str]]:
    """Every line of a run's output with its second since the run started, also written to `log` as it comes (a
    run cut short leaves its log up to there)."""
    lines: list[tuple[float, str]] = []
    with open(log, "w") as f:
        for line in stream or []:
            t = time.time() - started
            lines.append((t, line))
            f.write(f"{t:8.2f} {line}")
            f.flush()
    return lines


# the training loop's first line and its last: Ultralytics' (native, and a verbose yolo_ray run), yolo_ray's driver's
# (its start line; its line for the last epoch, printed once that epoch's validation and checkpoint are done)
LOOP_START = ("Starting training for", TRAINING_STARTS)
LOOP_END = ("epochs completed in", "[yolo_ray] epoch ")


def phases(lines: list[tuple[float, str]], wall: float) -> dict[str, float | None]:
    """A run's wall clock in three: start-up (process start to the training loop: imports, Ray and its workers,
    dataset scan and caching, graph capture), the loop (epochs with their validation and checkpoints), and the
    end (final evaluation of best.pt, export, shutdown)."""
    start = next((t for t, line in lines if any(m in line for m in LOOP_START)), None)
    end = next((t for t, line in reversed(lines) if any(m in line for m in LOOP_END)), None)
    if start is None or end is None:
        return {"startup_s": None, "loop_s": None, "end_s": None}
    return {"startup_s": round(start, 1), "loop_s": round(end - start, 1), "end_s": round(wall - end, 1)}

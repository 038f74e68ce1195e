"""`yolo-ray bench`: native Ultralytics vs yolo_ray on the same machine, data and settings, in one run.

Every variant trains through its real entry point in a subprocess with validation off until the last epoch, so
the gaps between Ultralytics' results.csv rows are training time; steady state drops the first epoch. Beside them,
the GPU-only ceiling: the model's own training step on random tensors (no loader). Prints a table, writes JSON.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import IO, Any

from yolo_ray import gitinfo, tasks
from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError
from yolo_ray.summary import read_history, read_jsonl
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


class Sampler:
    """CPU and GPU utilisation and peak GPU memory, sampled every second while a variant runs (its whole wall time,
    start-up and final validation included), over the first `devices` GPUs: the ones the variant trains on.

    Memory is the variant's own: what its processes (the driver `pid` and every process it started: Ray's workers,
    torch.distributed's ranks) hold on one GPU, the most on any. The bench process's own leftovers (the ceilings'
    cached blocks and graph pools) and other tenants are not counted, as nvidia-smi's memory.used would count them.
    Where nvidia-smi lists no processes (a container that hides them), memory.used above its level at the first
    sample stands in."""

    def __init__(self, devices: int) -> None:
        self.devices = devices
        self.pid: int | None = None  # the variant's driver, set once it has started
        self.cpu: list[float] = []
        self.gpu: list[float] = []
        self.mem_mib = 0.0
        self._baseline: list[float] | None = None  # memory.used per GPU at the first sample: the fallback's zero
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import psutil

        psutil.cpu_percent(None)
        while not self._stop.wait(1.0):
            self.cpu.append(psutil.cpu_percent(None))
            try:
                gpus = _nvidia_smi("--query-gpu=index,uuid,utilization.gpu,memory.used")[: self.devices]
                apps = _nvidia_smi("--query-compute-apps=gpu_uuid,pid,used_memory")
            except (OSError, subprocess.SubprocessError, ValueError):
                continue
            if not gpus:
                continue
            self.gpu.append(statistics.mean(float(g[2]) for g in gpus))
            used = [float(g[3]) for g in gpus]
            self._baseline = self._baseline or used
            if apps:
                pids = _process_tree(self.pid) if self.pid else set()
                self.mem_mib = max(self.mem_mib, variant_mem_mib(gpus, apps, pids))
            else:
                self.mem_mib = max(self.mem_mib, *(u - b for u, b in zip(used, self._baseline, strict=True)))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float | None]:
        return {
            "cpu_util_pct": round(statistics.mean(self.cpu), 1) if self.cpu else None,
            "gpu_util_pct": round(statistics.mean(self.gpu), 1) if self.gpu else None,
            "peak_gpu_mem_gib": round(self.mem_mib / 1024, 2) if self.mem_mib else None,
        }


def _nvidia_smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5, check=True
    )
    return [[c.strip() for c in r.split(",")] for r in out.stdout.strip().splitlines() if r.strip()]


def _process_tree(pid: int) -> set[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:  # exited between samples
        return set()


def variant_mem_mib(gpus: list[list[str]], apps: list[list[str]], pids: set[int]) -> float:
    """The most MiB that `pids` hold together on any one of `gpus` ([index, uuid, ...] rows), from nvidia-smi's
    compute apps ([gpu_uuid, pid, used MiB] rows)."""
    per_gpu = dict.fromkeys((g[1] for g in gpus), 0.0)
    for uuid, pid, used in apps:
        if uuid in per_gpu and pid.isdigit() and int(pid) in pids and used.replace(".", "", 1).isdigit():
            per_gpu[uuid] += float(used)
    return max(per_gpu.values(), default=0.0)


def _results_csv(run_dir: Path) -> list[dict[str, float]]:
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
    save_s) and yolo_ray's (epoch metrics, checkpoint hand-off to Ray: report_s); and the writer thread's time per
    checkpoint, off the training thread (checkpoint_write_s)."""
    rows = read_history(run_dir)
    rows = rows[1:] or rows

    def median(key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return round(statistics.median(values), 3) if values else None

    loop = median("images_per_s")
    return {
        "loop_images_per_s": loop and round(loop, 1),
        **{k: median(k) for k in ("save_s", "report_s", "checkpoint_write_s")},
    }


def _overrides(
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
    twice linear 0.566; the base batch reached 0.796."""
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
    rows = _results_csv(run_dir)
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


# Ultralytics prints these in native and in yolo_ray's rank 0 alike: the training loop's first and last line
LOOP_START, LOOP_END = "Starting training for", "epochs completed in"


def phases(lines: list[tuple[float, str]], wall: float) -> dict[str, float | None]:
    """A run's wall clock in three: start-up (process start to the training loop: imports, Ray and its workers,
    dataset scan and caching, graph capture), the loop (epochs with their validation and checkpoints), and the
    end (final evaluation of best.pt, export, shutdown)."""
    start = next((t for t, line in lines if LOOP_START in line), None)
    end = next((t for t, line in reversed(lines) if LOOP_END in line), None)
    if start is None or end is None:
        return {"startup_s": None, "loop_s": None, "end_s": None}
    return {"startup_s": round(start, 1), "loop_s": round(end - start, 1), "end_s": round(wall - end, 1)}


@contextlib.contextmanager
def kernel_mode(mode: str) -> Iterator[None]:
    """The kernel choice a step runs under: `default` (torch's start-up state, the issue's reference ceiling),
    `deterministic` (Ultralytics' init_seeds for train.deterministic=true, its default: deterministic algorithms and
    cuDNN kernels) or `autotuned` (deterministic off and cuDNN's autotuner on: yolo_ray with
    train.deterministic=false). Left as torch starts afterwards."""
    import torch

    from yolo_ray import ultralytics_env

    ultralytics_env.setup()  # before Ultralytics' first import: offline, no settings written
    from ultralytics.utils.torch_utils import init_seeds, unset_deterministic

    if mode == "deterministic":
        init_seeds(0, deterministic=True)
    torch.backends.cudnn.benchmark = mode == "autotuned"
    try:
        yield
    finally:
        unset_deterministic()
        torch.backends.cudnn.benchmark = False


def step_ceiling(
    s: BenchSettings, device: str, batch: int, graphs: bool = False, mode: str = "default"
) -> dict[str, Any]:
    """images/s of the model's own training step on random data: the GPU limit with no loader (the eager step,
    the issue's reference; with graphs, the same step with the model's forward/backward as CUDA graph replays),
    under one kernel_mode."""
    with kernel_mode(mode):
        row = _step_ceiling(s, device, batch, graphs)
    kind = ("graphs-" if graphs else "") + ("" if mode == "default" else f"{mode}-")
    return {"name": f"{device.split(':')[0]}-step-ceiling-{kind}b{batch}", **row, "kernel_mode": mode}


def _step_ceiling(s: BenchSettings, device: str, batch: int, graphs: bool) -> dict[str, Any]:
    import torch

    from yolo_ray import ultralytics_env
    from yolo_ray.worker.cuda_graphs import GraphedModel

    ultralytics_env.setup()
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    dev = torch.device(device)
    model = DetectionModel(s.model, nc=s.classes, verbose=False).to(dev)
    model.args = DEFAULT_CFG
    channels_last = dev.type == "cuda"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=s.amp and dev.type == "cuda")
    b = batch
    imgs = torch.rand(b, 3, s.imgsz, s.imgsz, device=dev)
    if channels_last:
        imgs = imgs.contiguous(memory_format=torch.channels_last)
    n_box = 6  # targets: 6 boxes per image
    batch = {
        "img": imgs,
        "batch_idx": torch.arange(b, device=dev).repeat_interleave(n_box).float(),
        "cls": torch.randint(0, 3, (b * n_box, 1), device=dev).float(),
        "bboxes": torch.rand(b * n_box, 4, device=dev) * 0.5 + 0.25,
    }

    graphed = GraphedModel(model) if graphs else None  # captures on the first step

    def step() -> None:
        with torch.autocast(dev.type, dtype=torch.float16, enabled=s.amp and dev.type == "cuda"):
            loss, _ = model.loss(batch, graphed(batch["img"])) if graphed else model(batch)
        scaler.scale(loss.sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(s.ceiling_steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None
    return {
        "gpus": 1,
        "images_per_s": round(b * s.ceiling_steps / dt, 1),
        "peak_gpu_mem_gib": mem and round(mem, 2),
        "batch_per_gpu": b,
        "channels_last": channels_last,
        "amp": s.amp and dev.type == "cuda",
    }


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
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": os.environ.get("YOLO_RAY_COMMIT")
        or gitinfo.commit(Path(__file__).parent),  # the GPU machine gets no .git
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
        results.append(run_variant(s, name, [*args, *_overrides(s, name, n, batch), *profile], n, env, batch))
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
        *_overrides(tta, native_name, 1, s.batch_per_gpu, True),
    ]
    native = run_variant(tta, native_name, native_args, 1, env, s.batch_per_gpu)
    if "error" in native:
        return {"native": native}
    native_dir = Path(s.out_dir).resolve() / native_name
    native_rows = _results_csv(native_dir)
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
        args = [*_overrides(ours_settings, name, gpus, tb, True), *fastest, f"train.lr0={lr0}"]
        args.append(f"scaling.use_gpu={str(not cpu).lower()}")
        ours = run_variant(ours_settings, name, args, gpus, env, tb)
        run_dir = Path(s.out_dir).resolve() / name
        entry = {"batch_per_gpu": tb, "global_batch": tb * gpus, "lr0": lr0, "wall_s": ours["wall_s"]}
        if "error" in ours:
            entry["error"] = ours["error"]
        else:
            entry.update(reached(_results_csv(run_dir), read_history(run_dir), target, result["native"]))
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

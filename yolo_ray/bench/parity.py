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
import re
import statistics
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from yolo_ray import gitinfo
from yolo_ray import run_layout as layout
from yolo_ray.bench import coco_eval, environment
from yolo_ray.bench.parity_paths import DEFAULT_PATHS, LARGE_BATCH, PATHS, SHARED_GPU, VAL_CPUS, VALIDATING
from yolo_ray.bench.parity_report import combine, file_header, mark_contended, merged_results, print_table, summarize
from yolo_ray.bench.run_ledger import RunLedger
from yolo_ray.bench.variant_run import GRAPHS, BenchSettings, device_path, run_variant, throughput_lr0
from yolo_ray.config import ConfigError
from yolo_ray.summary import read_history, read_jsonl


@dataclass
class ParitySettings:
    model: str = "yolo11n.yaml"
    imgsz: int = 640
    images: int = 3000  # train split; val gets a fifth
    classes: int = 5
    data_seed: int = 0
    epochs: str = "10"  # comma-separated: each path trains to each of these, e.g. "10,30"
    seeds: str = "0,1,2"
    paths: str = ",".join(DEFAULT_PATHS)
    batch_per_gpu: int = 64
    throughput_batch_per_gpu: int = 256
    close_mosaic: int = 3
    workers: int = 8  # loader processes (native and Ultralytics' loader)
    deterministic: bool = True
    data_dir: str = "datasets/parity"
    out_dir: str = "benchmarks/runs-parity"
    runs: str = ""  # comma-separated run names (`graphs-e30-s1`) instead of every path x epochs x seeds; `none`
    parallel: int = 1  # runs at once: accuracy is deterministic, but their clocks are then contended
    gpu_mem_gib: float = 0  # GPU memory concurrent runs may hold together (0: 90% of the device's)
    # comma-separated result JSONs of earlier calls (FILE or FILE:path+path to take only those paths' runs): their
    # runs join the table and are not run again, unless `runs` names them (a re-run replaces it and is compared)
    merge: str = ""
    data: str = ""  # a data.yaml to train on instead of the generated set (e.g. benchmarks/link_dataset.py's)
    # a variant of every run of this call: config overrides after the benchmark's own ("train.optimizer=AdamW
    # train.lr0=0.002"), and the label its runs and table rows carry (`throughput.adamw-e30-s0`, `throughput.adamw`)
    overrides: str = ""
    label: str = ""

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


class Entry(NamedTuple):
    """One training run of the benchmark."""

    path: str
    epochs: int
    seed: int
    args: list[str]  # the path's CLI arguments
    batch: int  # images per device
    label: str = ""  # a variant's (ParitySettings.overrides)

    @property
    def variant(self) -> str:
        return f"{self.path}.{self.label}" if self.label else self.path

    @property
    def name(self) -> str:
        return f"{self.variant}-e{self.epochs}-s{self.seed}"


RUN_NAME = re.compile(r"^(?P<path>[a-z]+)-e(?P<epochs>\d+)-s(?P<seed>\d+)$")


def plan(p: ParitySettings, cpu: bool) -> list[Entry]:
    """Every run: `runs` as named, else each path for each epoch count and seed, longest schedules first, paths
    interleaved within a seed (a drift of the shared host over the call then falls on no one path)."""
    if p.runs == "none":  # only the table of merged files
        return []
    # a label names run directories: checked here, not by each run's run.name check after the data is generated
    if (str(p.overrides).strip() or str(p.label)) and not re.fullmatch(r"[a-z0-9_.]+", str(p.label)):
        raise ConfigError(
            "yolo-ray bench --parity",
            "label",
            f"{p.label!r} cannot name a variant's runs (overrides={p.overrides!r}).",
            "set label=NAME (lower-case letters, digits, `_` or `.`), e.g. label=adamw.",
        )
    if p.runs:
        wanted = []
        for name in p.listed("runs"):
            m = RUN_NAME.match(name)
            if not m:
                raise ConfigError(
                    "yolo-ray bench --parity", "runs", f"{name!r} is not a run name.", "write e.g. graphs-e30-s1."
                )
            wanted.append((m["path"], int(m["epochs"]), int(m["seed"])))
    else:
        epochs = sorted((int(e) for e in p.listed("epochs")), reverse=True)
        seeds = [int(x) for x in p.listed("seeds")]
        wanted = [(path, e, seed) for e in epochs for seed in seeds for path in p.listed("paths")]
    gpu_only = ("graphs", "throughput", "valgraphs")
    bad = sorted({x for x, _, _ in wanted if x not in PATHS or (cpu and x in gpu_only)})
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
    args["nativethroughput"] = args["native"]  # at throughput mode's batch and lr0 (LARGE_BATCH, below)
    # the fast path with data.loader=stream: its default decoder (data.stream_decode auto), OpenCV in Ray Data's CPU
    # tasks, OpenCV in the Train worker's processes, or nvJPEG on its GPU
    stream = [*use, "data.loader=stream", *fast, *([] if cpu else GRAPHS)]
    args["stream"], args["streamcpu"] = stream, [*stream, "data.stream_decode=cpu"]
    args["streamworker"] = [*stream, "data.stream_decode=worker"]
    args["streamdevice"] = [*stream, "data.stream_decode=device"]
    for v, extra in VALIDATING.items():  # the fast path (graphs on a GPU), validating every epoch
        on_gpu = [] if cpu else [*GRAPHS, *(SHARED_GPU if v == "valasync" else [])]
        args[v] = [*use, *device_path(BenchSettings()), *on_gpu, *extra]
    out = []
    for path, epochs, seed in wanted:
        large = path in LARGE_BATCH
        batch = p.throughput_batch_per_gpu if large else p.batch_per_gpu
        extra = [f"train.lr0={throughput_lr0(batch)}"] if large else []
        out.append(Entry(path, epochs, seed, [*args[path], *extra], batch, str(p.label)))
    return out


def _overrides(p: ParitySettings, entry: Entry) -> list[str]:
    name, epochs, seed, batch = entry.name, entry.epochs, entry.seed, entry.batch
    cpus = max(1, (os.cpu_count() or 1) - 1)
    if entry.path in VALIDATING:
        validation = ["train.val=true"]
        if entry.path == "valasync":
            val_cpus = VAL_CPUS if cpus > 2 * VAL_CPUS else 1  # a small machine: one CPU each
            cpus = max(1, cpus - val_cpus)
            validation.append(f"train.val_cpus={val_cpus}")
    else:
        validation = ["train.val=false"]  # validated once, at the last epoch: the scorers below judge the final weights
    # the stream: the run's own rule (ray_cluster.auto_cpus_per_worker), which leaves Ray Data CPUs to read with
    worker_cpus = "auto" if entry.path.startswith("stream") else cpus
    data = [f"data.path={Path(p.data).resolve()}"] if p.data else ["data.path=synthetic"]
    return [
        f"model={p.model}",
        *data,
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
        *validation,
        "train.plots=false",
        f"train.close_mosaic={p.close_mosaic}",
        "tracking.enabled=false",
        "scaling.num_workers=1",
        f"scaling.cpus_per_worker={worker_cpus}",
        f"run.storage_path={p.out_dir}",
        f"run.name={name}",
        *str(p.overrides).split(),  # last: a variant's settings win
    ]


def training_seconds(run_dir: Path) -> float | None:
    """The batch loops' seconds over all epochs: yolo_ray's history.jsonl, or native's epoch timer."""
    native = run_dir / layout.NATIVE_EPOCHS
    if native.exists():
        return round(sum(r["train_s"] for r in read_jsonl(native)), 2)
    rows = read_history(run_dir)
    return round(sum(r["train_time_s"] for r in rows), 2) if rows else None


def run_one(
    p: ParitySettings, data_yaml: Path, gt: dict[str, Any], entry: Entry, cpu: bool, env: dict[str, str]
) -> dict[str, Any]:
    bench = BenchSettings(images=p.images, out_dir=p.out_dir)
    args = [*entry.args, *_overrides(p, entry)]
    started = time.time()
    _LEDGER.started(entry.name, started)  # other benchmark calls on this host see this run's time
    try:
        row = run_variant(bench, entry.name, args, 1, env, entry.batch)
    finally:
        _LEDGER.ended(entry.name, time.time())
    out: dict[str, Any] = {
        "path": entry.variant,
        "epochs": entry.epochs,
        "seed": entry.seed,
        "batch_per_gpu": entry.batch,
        "name": entry.name,
        "started": round(started, 1),
        "ended": round(time.time(), 1),
    }
    if "error" in row:
        return {**out, "error": row["error"]}
    run_dir = Path(p.out_dir).resolve() / entry.name
    weights, device = layout.weights(run_dir) / "last.pt", "cpu" if cpu else "0"
    with _SCORING:  # Ultralytics' validator keeps process-wide state: one scoring at a time
        scores = coco_eval.score(weights, data_yaml, p.imgsz, device, run_dir / "score", gt)
        if not cpu:
            import torch

            torch.cuda.empty_cache()  # the runs beside this process need the memory more
    keys = ("wall_s", "startup_s", "loop_s", "end_s", "images_per_s", "loop_images_per_s", "peak_gpu_mem_gib")
    keys += ("train_time_s", *sorted(k for k in row if k.startswith("feed/")))  # medians an epoch (2..n)
    return {
        **out,
        **scores,
        "results_csv_mAP50-95": row["mAP50-95"],
        "train_s": training_seconds(run_dir),
        **{k: row.get(k) for k in keys},
        **epoch_clock(run_dir),
    }


def epoch_clock(run_dir: Path) -> dict[str, Any]:
    """From history.jsonl: the mean epoch (the training process's clock, validation included when inline) over
    epochs 2..n-1 (the first compiles and captures, the last validates best.pt or waits for the validations still
    out) and, over the same epochs, its end (end_of_epoch_s: what the training thread does after its batch loop,
    inline validation included; unlike the epoch, it does not move with another run's training speed); the mean
    validation seconds, the epoch with the best fitness, and the largest async validation lag."""
    rows = read_history(run_dir)
    if not rows:
        return {}
    middle = rows[1:-1] or rows
    val = [r["val_s"] for r in rows if r.get("val_s") is not None]
    ends = [r["epoch_time_s"] - r["train_time_s"] for r in middle if r.get("train_time_s") is not None]
    best = max(rows, key=lambda r: r.get("fitness", 0.0))
    return {
        "epoch_s": round(statistics.mean(r["epoch_time_s"] for r in middle), 3),
        "end_of_epoch_s": round(statistics.mean(ends), 3) if ends else None,
        "val_s": round(statistics.mean(val), 3) if val else None,
        "best_epoch": best["epoch"] if best.get("fitness") else None,
        "val_lag_max": max((r.get("val_lag_epochs", 0) for r in rows), default=0),
        "history_epochs": [r["epoch"] for r in rows],
    }


_SCORING = threading.Lock()
_LEDGER = RunLedger()


def expected_gpu_gib(batch: int) -> float:
    """What one run holds on the GPU at its peak (cached blocks included), as measured on an H200 at 640 px: ~20-28
    GiB at 64 images (native or yolo_ray; validation at twice the batch is the peak), ~64-70 GiB at 256."""
    return 28.0 if batch <= 64 else 70.0 * batch / 256


def run_all(
    p: ParitySettings,
    entries: list[Entry],
    one: Callable[[Entry], dict[str, Any]],
    on_done: Callable[[dict[str, Any]], None],
) -> None:
    """Every entry through `one`, up to p.parallel at once within the GPU memory budget (a run that does not fit
    waits; one that ran out of memory beside others is tried once more, alone if need be)."""
    budget = p.gpu_mem_gib or _device_gib() * 0.9
    pending, retried = list(entries), set()
    running: dict[futures.Future, Entry] = {}
    with futures.ThreadPoolExecutor(max_workers=max(1, p.parallel)) as pool:
        while pending or running:
            for e in list(pending):
                held = sum(expected_gpu_gib(r.batch) for r in running.values())
                fits = len(running) < max(1, p.parallel) and held + expected_gpu_gib(e.batch) <= budget
                if not running or (fits and e.name not in retried):
                    pending.remove(e)
                    running[pool.submit(one, e)] = e
            done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            for f in done:
                e, row = running.pop(f), f.result()
                if "out of memory" in row.get("error", "") and e.name not in retried:
                    retried.add(e.name)
                    pending.append(e)
                    continue
                print(f"[parity] {_progress(row)}", flush=True)
                on_done(row)


def _device_gib() -> float:
    import torch

    if not torch.cuda.is_available():
        return float("inf")
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def _progress(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['name']}: ERROR {row['error'][-300:]}"
    return (
        f"{row['name']}: mAP50-95 {row['ultralytics']['mAP50-95']:.4f} (COCO {row['coco']['AP']:.4f}) "
        f"wall {row['wall_s']} s (start-up {row['startup_s']}, loop {row['loop_s']}, end {row['end_s']})"
    )


def run(p: ParitySettings, cpu: bool, out_json: Path) -> dict[str, Any]:
    import torch

    earlier = merged_results(p)
    done = {r["name"] for r in earlier if "error" not in r}
    entries = plan(p, cpu)  # bad options fail here, before any data or GPU work
    if not p.runs:  # runs named explicitly run again (a reproduction check); the others only once
        entries = [e for e in entries if e.name not in done]
    report: dict[str, Any] = {
        "kind": "parity",
        "machine": platform.node(),
        "gpu_name": torch.cuda.get_device_name(0) if not cpu and torch.cuda.is_available() else None,
        "cpus": os.cpu_count(),
        "uncompiled_packages": environment.check(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **gitinfo.provenance(Path(__file__).parent),
        "settings": asdict(p),
        "merged_from": [file_header(item.partition(":")[0]) for item in p.listed("merge")],
        "results": [],
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    fresh: list[dict[str, Any]] = []

    def save(row: dict[str, Any] | None = None) -> None:  # after every run: a call cut short keeps what ran
        if row is not None:
            fresh.append(row)
        mark_contended(fresh, _LEDGER.others(time.time()))
        report["results"], report["reproduced"] = combine(earlier, fresh)
        report["summary"] = summarize(report["results"])
        out_json.write_text(json.dumps(report, indent=2))

    if entries:
        data_yaml, gt = _data(p)
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"), "YOLO_OFFLINE": "1"}
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # concurrent runs: less held, unused
        run_all(p, entries, lambda e: run_one(p, data_yaml, gt, e, cpu, env), save)
    save()
    print_table(report)
    print(f"\nwritten: {out_json}")
    return report


def _data(p: ParitySettings) -> tuple[Path, dict[str, Any]]:
    """The real-shaped dataset (generated once) and its val split's COCO ground truth (one for every run)."""
    from yolo_ray.data.synth import SynthSpec, ensure

    spec = SynthSpec(images=p.images, imgsz=p.imgsz, classes=p.classes, seed=p.data_seed, style="real")
    data_yaml = Path(p.data).resolve() if p.data else ensure(p.data_dir, spec)
    Path(p.out_dir).mkdir(parents=True, exist_ok=True)
    return data_yaml, coco_eval.ground_truth(data_yaml)

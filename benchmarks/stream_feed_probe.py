"""How fast the stream loader's Ray Data side can feed one GPU rank, without training (issue #24): OpenCV decoding
bare (one process, then one per CPU at once), then the stream's Ray Dataset read as a Train worker reads its shard
(streaming_split, batches to the GPU) at several block sizes, with the CPU seconds its tasks spent per image and a
py-spy sample of one read task.

    python benchmarks/stream_feed_probe.py datasets/parity/data.yaml [--epochs 3] [--out FILE]
    python benchmarks/stream_feed_probe.py datasets/parity/data.yaml --skip-decode \
        --variants 64:1:4:free,64:1:4:bytes,64:1:4:worker --threads 13
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from yolo_ray.data.image_decode import decode_cpu, decode_into, resize_cpu
from yolo_ray.data.stream_pipeline import read_rows
from yolo_ray.data.stream_source import Filesystem, label_path


def decode_ms(files: list[str]) -> float:
    import cv2

    cv2.setNumThreads(1)
    data = [Path(f).read_bytes() for f in files]
    t = time.perf_counter()
    for i, d in enumerate(data):
        resize_cpu(decode_cpu(d, files[i]), 640)
    return (time.perf_counter() - t) / len(data) * 1000


def worker_cpu() -> dict[int, float]:
    """CPU seconds so far of each Ray worker process (read tasks, the split coordinator; this driver excluded)."""
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if " ".join(p.info["cmdline"] or []).startswith("ray::"):
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def cpu_since(before: dict[int, float]) -> float:
    return sum(s - before.get(pid, 0.0) for pid, s in worker_cpu().items())


def sample_task(out: Path, seconds: int) -> None:
    """py-spy (native frames) on one read task for `seconds`."""
    pids = [p.pid for p in psutil.process_iter(["cmdline"]) if "MapBatches" in " ".join(p.info["cmdline"] or [])]
    if pids and shutil.which("py-spy"):
        cmd = ["py-spy", "record", "-p", str(pids[0]), "-d", str(seconds), "-r", "100", "--native", "--format", "raw"]
        subprocess.run([*cmd, "-o", str(out)], capture_output=True, timeout=seconds + 30)


def read_cropped(batch: dict[str, np.ndarray], **kw: object) -> dict[str, np.ndarray]:
    """read_rows, each image shipped at its own size (a ragged column) instead of in an imgsz^2 slot."""
    out = read_rows(batch, **kw)  # type: ignore[arg-type]
    full = out.pop("pixels")
    crops = [full[i, :h, :w] for i, (h, w) in enumerate(out["hw"].tolist())]
    out["pixels"] = np.array([*crops, None], dtype=object)[:-1]
    return out


class TaskCount(threading.Thread):
    """How many read tasks run at once (Ray names a busy worker process after its task), sampled every 0.1 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            names = (" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
            self.samples.append(sum(n.startswith("ray::MapBatches") for n in names))

    def mean(self) -> float:
        self.stop.set()
        return round(float(np.mean(self.samples)), 2) if self.samples else 0.0


def to_device(b: dict, mode: str, host: object, decoder: object = None) -> None:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if mode == "bytes":  # Ray Data's side alone: the compressed bytes, not decoded
        return
    if mode in ("worker", "threads"):  # decoded by this process's workers (processes or threads) into pinned memory
        pixels, _ = decoder.slots(decoder.submit(b["data"], b["file"]))  # type: ignore[union-attr]
        pixels.to(dev, non_blocking=True)
        torch.cuda.synchronize() if dev == "cuda" else None
        return
    if mode != "crop":
        torch.from_numpy(b["pixels"]).to(dev)
        return
    buf = host[: len(b["pixels"])]  # type: ignore[index]
    buf.fill_(114)
    for i, im in enumerate(b["pixels"]):
        buf[i, : im.shape[0], : im.shape[1]] = torch.from_numpy(im)
    buf.to(dev, non_blocking=True)
    torch.cuda.synchronize() if dev == "cuda" else None


class ThreadDecoder:
    """stream_decode worker until 2026-12-05: OpenCV threads of the consumer's process into one pinned batch."""

    def __init__(self, imgsz: int, device: Any, threads: int):
        import torch

        self.pinned, self.pool = device.type == "cuda", ThreadPoolExecutor(max(1, threads))
        self.empty = lambda n: torch.empty((n, imgsz, imgsz, 3), dtype=torch.uint8, pin_memory=self.pinned)

    def submit(self, data: np.ndarray, files: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return data, files

    def slots(self, batch: tuple[np.ndarray, np.ndarray]) -> tuple[Any, np.ndarray]:
        data, files = batch
        out = self.empty(len(data))
        host = out.numpy()
        hw = self.pool.map(lambda i: decode_into(host[i], data[i], str(files[i])), range(len(data)))
        return out, np.array(list(hw), dtype=np.int32).reshape(-1, 2)

    def close(self) -> None:
        self.pool.shutdown()


def feed(
    rows: list[dict],
    rows_per_block: int,
    batch: int,
    epochs: int,
    profile: Path | None,
    to_gpu: bool = True,
    prefetch: int = 4,
    mode: str = "plain",
    threads: int = 13,
    task_cpus: float = 1.0,
) -> list[dict]:
    """mode: plain (imgsz^2 slots), crop (each image at its size, padded on the consumer into pinned memory),
    free (plain, with Ray Data's per-operator object store reservation off), free10 (free, and 10 x the
    downstream capacity an operator may queue for); with the reservation off as the pipeline has it: bytes (Ray Data
    reads the compressed bytes, nothing decodes), worker (bytes, decoded here by `threads` - 1 processes:
    data.stream_decode worker), threads (bytes, decoded here by `threads` OpenCV threads: stream_decode worker
    until 2026-12-05)."""
    import ray.data
    import torch
    from ray.data import DataContext, RandomSeedConfig

    ctx = DataContext.get_current()
    ctx.op_resource_reservation_enabled = mode not in ("free", "free10", "bytes", "worker", "threads")
    on_cpu = mode not in ("bytes", "worker", "threads")
    decoder: Any = None
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if mode == "worker":
        from yolo_ray.data.stream_loader import Decoder

        decoder = Decoder(640, dev, threads, mode="worker", batch=batch)
    elif mode == "threads":
        decoder = ThreadDecoder(640, dev, threads)
    ctx.downstream_capacity_backpressure_ratio = 10.0 if mode == "free10" else 2.0
    host = torch.empty((batch, 640, 640, 3), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    ds = ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // rows_per_block))
    ds = ds.random_shuffle(seed=RandomSeedConfig(seed=0, reseed_after_execution=True))
    ds = ds.map_batches(read_cropped if mode == "crop" else read_rows,
                        fn_kwargs={"fs": Filesystem("local"), "imgsz": 640, "decode": on_cpu},
                        batch_size=batch, num_cpus=task_cpus, batch_format="numpy")  # fmt: skip
    shard = ds.streaming_split(1, equal=True)[0]
    out = []
    for epoch in range(epochs):
        if profile and epoch == 1:
            threading.Thread(target=sample_task, args=(profile, 6), daemon=True).start()
        tasks = TaskCount()
        tasks.start()
        cpu0, t, n, wait = worker_cpu(), time.perf_counter(), 0, 0.0
        t_wait = time.perf_counter()
        for b in shard.iter_batches(batch_size=batch, batch_format="numpy", prefetch_batches=prefetch):
            wait += time.perf_counter() - t_wait
            if to_gpu:
                to_device(b, mode, host, decoder)
            n += len(b["id"])
            t_wait = time.perf_counter()
        dt = time.perf_counter() - t
        cpu = cpu_since(cpu0)
        row = {"rows_per_block": rows_per_block, "to_gpu": to_gpu, "prefetch": prefetch, "mode": mode, "epoch": epoch,
               "task_cpus": task_cpus, **({"threads": threads} if decoder is not None else {})}  # fmt: skip
        out.append({**row, "images": n, "s": round(dt, 2), "images_per_s": round(n / dt, 1),
                    "consumer_wait_share": round(wait / dt, 3), "tasks_running_mean": tasks.mean(),
                    "ray_cpu_ms_per_image": round(cpu / n * 1000, 2)})  # fmt: skip
        print(out[-1], flush=True)
    print(shard.stats()[-3000:], flush=True)
    if decoder is not None:
        decoder.close()
    return out


def spin() -> None:
    """Pure Python for ever: the training thread's share of the GIL (Ultralytics' loop, the loss's Python)."""
    n = 0
    while True:
        n += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_yaml")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--blocks", default="256,64")
    ap.add_argument(
        "--variants",
        default="",
        help="BLOCK:to_gpu(0|1):prefetch[:plain|crop|free|free10|bytes|worker|threads],... (not --blocks)",
    )
    ap.add_argument("--threads", type=int, default=13, help="worker: its CPUs (processes: one fewer); threads: threads")
    ap.add_argument("--task-cpus", type=float, default=1.0, help="each read task's num_cpus (the pipeline's: 1)")
    ap.add_argument("--busy", action="store_true", help="a thread of the consumer runs Python all along (as training)")
    ap.add_argument("--skip-decode", action="store_true", help="skip the bare OpenCV timing")
    ap.add_argument("--out", default="benchmarks/runs-feed/feed.json")
    a = ap.parse_args()
    d = yaml.safe_load(Path(a.data_yaml).read_text())
    folder = Path(d.get("path", Path(a.data_yaml).parent)) / d["train"]
    files = sorted(str(f) for f in folder.iterdir())
    out_dir = Path(a.out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"images": len(files), "cpus": os.cpu_count(), "busy": a.busy}
    if not a.skip_decode:
        report["decode_ms_1_process"] = round(decode_ms(files[:256]), 2)
        procs = (os.cpu_count() or 2) - 1
        with mp.get_context("spawn").Pool(procs) as pool:
            ms = pool.map(decode_ms, [files[:256]] * procs)
        report[f"decode_ms_{procs}_processes"] = round(float(np.mean(ms)), 2)
        print(report, flush=True)
    import ray

    ray.init(include_dashboard=False, log_to_driver=False)
    rows = [{"id": i, "image": f, "label": label_path(f)} for i, f in enumerate(files)]
    report["feed"] = []
    variants = [[*v.split(":"), "plain"][:4] for v in a.variants.split(",")] if a.variants else []
    variants = variants or [[k, "1", "4", "plain"] for k in a.blocks.split(",")]
    report["object_store_gib"] = round(ray.cluster_resources().get("object_store_memory", 0) / 2**30, 1)
    report["dev_shm_gib"] = round(shutil.disk_usage("/dev/shm").total / 2**30, 1)
    print(report, flush=True)
    if a.busy:
        threading.Thread(target=spin, daemon=True).start()
    for k, gpu, pre, mode in variants:
        profile = out_dir / f"task-{k}-{gpu}-{pre}-{mode}.pyspy.txt"
        report["feed"] += feed(rows, int(k), 64, a.epochs, profile, gpu == "1", int(pre), mode, a.threads, a.task_cpus)
        Path(a.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""The stream loader's device decoding (nvJPEG + a bilinear resize on the GPU) against OpenCV's (Ultralytics'
load_image), image by image on a split: mean and largest |difference| in grey levels, by format, and decode speed,
OpenCV's also as data.stream_decode worker decodes: a Train worker holding 2, 3, 5, ... CPUs (1, 2, 4, ... decoding
processes), a batch at a time. --cpu-only: one core's ms an image of image_decode.decode_into against its former
way (the RGB turn as numpy's reversed-channel copy), passes alternated, and that both give the same pixels.

    python benchmarks/decode_probe.py datasets/scale10000/train/images 512 [--cpu-only] [--out FILE]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from yolo_ray.data.image_decode import PAD, decode_bgr, decode_cpu, decode_into, resize_cpu
from yolo_ray.data.stream_loader import Decoder


def probe(folder: Path, n: int, imgsz: int = 640, batch: int = 64) -> dict:
    files = sorted(folder.iterdir())[:n]
    data = [f.read_bytes() for f in files]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    decoder = Decoder(imgsz, dev, threads=8)
    diffs: dict[str, list[float]] = {}
    worst = 0.0
    for i in range(0, len(files), batch):
        got, sizes = decoder(data[i : i + batch], [str(f) for f in files[i : i + batch]])
        for f, d, padded, (h, w) in zip(files[i : i + batch], data[i : i + batch], got, sizes, strict=True):
            want, im = resize_cpu(decode_cpu(d, str(f)), imgsz), padded[:h, :w]
            assert tuple(im.shape) == want.shape, (f, im.shape, want.shape)
            diff = np.abs(im.cpu().numpy().astype(int) - want.astype(int))
            diffs.setdefault(f.suffix, []).append(float(diff.mean()))
            worst = max(worst, float(diff.max()))
    timings = {}
    ways = [("device", lambda c: decoder(c, np.array(["x"] * len(c)))),
            ("opencv_1_thread", lambda c: [resize_cpu(decode_cpu(x, "x"), imgsz) for x in c])]  # fmt: skip
    workers = []
    for t in worker_threads():  # data.stream_decode worker: a rank's processes into one pinned batch
        worker = Decoder(imgsz, dev, threads=t + 1, mode="worker", batch=batch)
        workers.append(worker)
        ways.append((f"worker_{t}_processes", lambda c, w=worker: w.slots(w.submit(c, np.array(["x"] * len(c))))))
    for name, fn in ways:
        chunk = np.array(data[:batch] + [b""], dtype=object)[:-1]
        fn(chunk)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(3):
            fn(chunk)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        timings[name] = round(3 * len(chunk) / (time.perf_counter() - t), 1)
    for w in workers:
        w.close()
    return {"images": len(files), "mean_abs_diff": {k: round(float(np.mean(v)), 3) for k, v in diffs.items()},
            "max_abs_diff": worst, "images_per_s": timings, "device": str(dev)}  # fmt: skip


def former_decode_into(slot: np.ndarray, data: bytes, name: str) -> tuple[int, int]:
    """decode_into as it was up to 2026-12-08: the RGB turn as numpy's copy of a reversed-channel view."""
    im = resize_cpu(decode_bgr(data, name), slot.shape[0])
    h, w = im.shape[:2]
    slot[:h, :w] = im[..., ::-1]
    slot[h:] = int(PAD)
    slot[:h, w:] = int(PAD)
    return h, w


def cpu_only(folder: Path, n: int, imgsz: int = 640, passes: int = 6) -> dict:
    """ms an image on one core (OpenCV single-threaded, as in a decoding process): medians over `passes` passes,
    the two ways alternated (and their order swapped each pass); images whose pixels differ between them."""
    import cv2

    cv2.setNumThreads(1)
    files = sorted(folder.iterdir())[:n]
    data = [f.read_bytes() for f in files]
    a, b = (np.empty((imgsz, imgsz, 3), np.uint8) for _ in range(2))
    differ = sum(
        decode_into(a, d, str(f)) != former_decode_into(b, d, str(f)) or not np.array_equal(a, b)
        for f, d in zip(files, data, strict=True)
    )
    ways = {"decode_into": decode_into, "former_decode_into": former_decode_into}
    ms: dict[str, list[float]] = {k: [] for k in ways}
    for i in range(passes):
        for name in list(ways)[:: 1 if i % 2 == 0 else -1]:
            t = time.perf_counter()
            for f, d in zip(files, data, strict=True):
                ways[name](a, d, str(f))
            ms[name].append(1e3 * (time.perf_counter() - t) / len(data))
    med = {k: round(float(np.median(v)), 3) for k, v in ms.items()}
    return {"images": len(files), "ms_per_image_median": med, "ms_per_image_passes": ms,
            "ratio": round(med["decode_into"] / med["former_decode_into"], 3), "images_differing": differ}  # fmt: skip


def worker_threads() -> list[int]:
    """1, 2, 4, ... up to this machine's CPUs less the 2 that stream_decode worker leaves Ray Data (at least 2)."""
    top = max(2, (os.cpu_count() or 2) - 2)
    return sorted({*(2**k for k in range(top.bit_length()) if 2**k <= top), top})


if __name__ == "__main__":
    run = cpu_only if "--cpu-only" in sys.argv else probe
    out = run(Path(sys.argv[1]), int(sys.argv[2]))
    print(json.dumps(out, indent=1))
    if "--out" in sys.argv:
        Path(sys.argv[sys.argv.index("--out") + 1]).write_text(json.dumps(out, indent=1))

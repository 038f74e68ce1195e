"""Keeps N CPUs as busy as the stream's decoding keeps them: N processes decode and resize the images of a folder
with OpenCV (image_decode.decode_into, one thread each), at `rate` images/s each (0: flat out), until stopped. Run
beside an in-memory training run, it separates what CPU load alone costs the training thread (clock, caches, memory
bandwidth) from what the stream's own code costs (issue #24).
    python benchmarks/cpu_burn.py DIR --processes 9 --rate 70 --seconds 120
"""

from __future__ import annotations

import argparse
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np


def burn(files: list[str], rate: float, seconds: float, imgsz: int) -> int:
    import cv2

    from yolo_ray.data.image_decode import decode_into

    cv2.setNumThreads(1)
    slot = np.empty((imgsz, imgsz, 3), np.uint8)
    blobs = [Path(f).read_bytes() for f in files]
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        decode_into(slot, blobs[n % len(blobs)], files[n % len(files)])
        n += 1
        if rate:
            time.sleep(max(0.0, start + n / rate - time.perf_counter()))
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("images")
    ap.add_argument("--processes", type=int, default=9)
    ap.add_argument("--rate", type=float, default=0.0, help="images/s per process (0: as fast as it can)")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--imgsz", type=int, default=640)
    a = ap.parse_args()
    files = sorted(str(p) for p in Path(a.images).iterdir() if p.suffix.lower() in (".jpg", ".png"))[:256]
    with get_context("spawn").Pool(a.processes) as pool:
        counts = pool.starmap(burn, [(files[i :: a.processes], a.rate, a.seconds, a.imgsz) for i in range(a.processes)])
    print(f"[cpu_burn] {a.processes} processes: {sum(counts) / a.seconds:.0f} images/s in all")


if __name__ == "__main__":
    main()

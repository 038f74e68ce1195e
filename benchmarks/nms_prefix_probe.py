"""Batched NMS (worker/batched_val.py) with each image's most confident NMS_PREFIX boxes tried first, against all of
each image's candidates in one call, on a young model's kind of output: YOLO11's 8400 anchors at 640 px, every class
score just above the validator's conf 0.001 (~40,000 candidates an image, cut to Ultralytics' max_nms 30,000), boxes
of random place and size. Checks that both give the same detections, then times each (the device synchronized).

    python benchmarks/nms_prefix_probe.py [--images 8] [--classes 5] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from yolo_ray.worker import batched_val

T = TypeVar("T")


def young_output(images: int, classes: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """[images, 4 + classes, 8400]: xywh in 640-px pixels, class scores uniform in [0, 0.02)."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(images, 2, 8400, generator=g) * 640
    wh = 8 + torch.rand(images, 2, 8400, generator=g) * 120
    scores = torch.rand(images, classes, 8400, generator=g) * 0.02
    out = torch.cat([xy, wh, scores], 1).to(device)
    return out.half() if device.type == "cuda" else out  # fp16 on a GPU, as a training-mode validation gives it


def repeat_timed(fn: Callable[[], T], repeats: int, cuda: bool) -> tuple[list[float], T]:
    """fn's seconds, the device synchronized, repeats times after a warm-up; and its last result."""
    seconds, out = [], None
    for _ in range(repeats + 1):  # the first is a warm-up
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    assert out is not None
    return seconds[1:], out


def timed(prediction: torch.Tensor, prefix: int, repeats: int) -> tuple[list[float], batched_val.Detections]:
    batched_val.NMS_PREFIX = prefix
    return repeat_timed(lambda: batched_val.batched_nms(prediction, 0.001, 0.7, max_det=300), repeats,
                        prediction.is_cuda)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--classes", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    prediction = young_output(a.images, a.classes, device)
    candidates = int((prediction[:, 4:] > 0.001).sum()) // a.images
    default = batched_val.NMS_PREFIX
    whole_s, whole = timed(prediction, 1 << 62, a.repeats)
    prefix_s, first = timed(prediction, default, a.repeats)
    batched_val.NMS_PREFIX = default
    same = whole.counts == first.counts and all(
        torch.equal(getattr(whole, k), getattr(first, k)) for k in ("boxes", "conf", "cls")
    )
    rows = [("whole image", statistics.median(whole_s)), (f"top {default} first", statistics.median(prefix_s))]
    print(f"{device.type}: {a.images} images, {candidates} candidates an image, same detections: {same}")
    print(f"{'NMS':20} {'s (median)':>10} {'per image ms':>12}")
    for name, s in rows:
        print(f"{name:20} {s:10.3f} {s / a.images * 1000:12.1f}")
    print(f"speed-up {rows[0][1] / rows[1][1]:.1f}x")
    if a.out:
        a.out.write_text(json.dumps({"device": str(device), "images": a.images, "candidates_per_image": candidates,
                                     "same_detections": same, "whole_s": whole_s, "prefix_s": prefix_s,
                                     "prefix": default}, indent=1))  # fmt: skip
    if not same:
        raise SystemExit("the two NMS orders gave different detections")


if __name__ == "__main__":
    main()

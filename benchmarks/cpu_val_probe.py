"""How fast YOLO11n's val forward runs on this host's CPUs (issue #23: validating on CPUs beside a GPU's training):
a fused, eval-mode model built from yolo11n.yaml, batches of 16 at 640x640 (the val split's largest rect shape),
channels_last, fp32 and under bf16 autocast, at several thread counts. Prints images/s per case and writes JSON.

    python benchmarks/cpu_val_probe.py --threads 4,8,12 --out cpu_val.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="4,8,12")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=5, verbose=False).fuse(verbose=False).eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.rand(a.batch, 3, 640, 640).contiguous(memory_format=torch.channels_last)
    rows = []
    for threads in map(int, a.threads.split(",")):
        torch.set_num_threads(threads)
        for dtype in ("fp32", "bf16"):
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                model(x)  # warm-up: oneDNN's primitives for this shape
                started = time.perf_counter()
                for _ in range(a.batches):
                    model(x)
                s = time.perf_counter() - started
            row = {"threads": threads, "dtype": dtype, "images_per_s": round(a.batch * a.batches / s, 1)}
            rows.append(row)
            print(row, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"what": "YOLO11n fused forward on CPU, 640x640", "batch": a.batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

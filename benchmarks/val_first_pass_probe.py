"""The first validation pass in a process against the next ones: Ultralytics' validator, three passes of one model
(YOLO11n from its yaml, fp16, conf 0.25 so NMS stays small) over the parity set's 600 val images.

    python benchmarks/val_first_pass_probe.py det|nodet      # deterministic kernels on or off

Prints one JSON line: each pass's seconds and Ultralytics' per-image speeds. On one H200 (2026-12-03) the first
pass's inference took 12-17 ms an image and the later ones 0.3-0.4, whatever the kernel mode. `model.val` letterboxes
rect batches: 5 shapes on the parity val split. Whether the first pass pays per shape or once per process is the
case left to run (one square shape)."""

import json
import sys
import time

import torch
from ultralytics import YOLO


def main() -> None:
    det = sys.argv[1] == "det"
    torch.backends.cudnn.deterministic = det
    torch.use_deterministic_algorithms(det, warn_only=True)
    model = YOLO("yolo11n.yaml")
    out: dict = {"deterministic": det}
    for i in range(3):
        started = time.perf_counter()
        r = model.val(data="datasets/parity/data.yaml", batch=32, imgsz=640, half=True, conf=0.25, plots=False,
                      verbose=False, workers=8, device=0)  # fmt: skip
        out[f"pass{i}"] = {
            "s": round(time.perf_counter() - started, 2),
            "speed_ms": {k: round(v, 2) for k, v in r.speed.items()},
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

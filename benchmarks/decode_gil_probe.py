"""Why stream_decode worker decodes in processes (decode_pool.py), not threads: one thread decoding images as the
stream does (image_decode.decode_into) alone, then beside a thread that runs Python all along (as a training thread
does), at several GIL switch intervals. A thread back from OpenCV waits for the GIL up to the switch interval.

    python benchmarks/decode_gil_probe.py DIR_OF_JPEGS [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from yolo_ray.data.image_decode import decode_into


def decoded_per_s(data: list[bytes], seconds: float, busy: bool) -> float:
    """Images/s of one decoding thread over `seconds`, with or without a thread running Python beside it."""
    stop, count = threading.Event(), [0]

    def decode() -> None:
        slot = np.empty((640, 640, 3), np.uint8)
        while not stop.is_set():
            decode_into(slot, data[count[0] % len(data)], "probe")
            count[0] += 1

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    threads = [threading.Thread(target=f) for f in ([decode, spin] if busy else [decode])]
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return count[0] / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("images", type=Path)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import cv2

    cv2.setNumThreads(1)
    data = [f.read_bytes() for f in sorted(a.images.glob("*.jpg"))[:200]]
    rows = [{"switch_interval_ms": 5.0, "busy": False, "images_per_s": round(decoded_per_s(data, a.seconds, False), 1)}]
    for ms in (5.0, 1.0, 0.5, 0.1):
        sys.setswitchinterval(ms / 1000)
        rows.append(
            {"switch_interval_ms": ms, "busy": True, "images_per_s": round(decoded_per_s(data, a.seconds, True), 1)}
        )
    print("switch interval ms | Python thread beside it | images/s of one decoding thread")
    for r in rows:
        print(f"{r['switch_interval_ms']:>18} | {str(r['busy']):>23} | {r['images_per_s']}")
    if a.out:
        a.out.write_text(json.dumps({"images": len(data), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

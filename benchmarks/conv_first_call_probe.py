"""What a validation's first pass pays for: the first forward of each input shape, against its repeat.

YOLO11n (from its yaml, fused, fp16, eval) under inference mode, on the batch shapes Ultralytics' validator feeds the
parity val split (5 rect shapes at batch 32, and a short last batch), timed per shape: first call, second call. Then a
second model instance on the same shapes (is the cost per model or per process?), then the same in channels_last
(the fast path's layout). One mode per process:

    python benchmarks/conv_first_call_probe.py default|nocudnn|benchmark|lru0|thread

`nocudnn` turns cuDNN off (is the cost cuDNN's?), `benchmark` turns its autotuner on, `lru0` is `default` with
TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT=0 set by the caller (no eviction of cuDNN's execution plans). `thread` runs the
shapes on another thread first, then times the main thread's first calls (are the plans per thread?; PyTorch's
cache of them is thread_local, which worker/inline_val_thread.py relies on). Prints one JSON line.
"""

import copy
import json
import sys
import threading
import time

import torch
from ultralytics.nn.tasks import DetectionModel

SHAPES = [(32, 672, 672), (32, 672, 512), (32, 512, 672), (32, 672, 384), (32, 384, 672), (24, 672, 672)]


def timed(model: torch.nn.Module, shape: tuple[int, int, int], layout: torch.memory_format) -> float:
    b, h, w = shape
    x = torch.rand(b, 3, h, w, device="cuda", dtype=torch.half).contiguous(memory_format=layout)
    torch.cuda.synchronize()
    started = time.perf_counter()
    model(x)
    torch.cuda.synchronize()
    return round(time.perf_counter() - started, 4)


def sweep(model: torch.nn.Module, layout: torch.memory_format) -> dict[str, list[float]]:
    first = [timed(model, s, layout) for s in SHAPES]
    second = [timed(model, s, layout) for s in SHAPES]
    return {
        "first": first,
        "second": second,
        "first_total": round(sum(first), 3),
        "second_total": round(sum(second), 3),
    }


def _in_inference(model: torch.nn.Module) -> dict[str, list[float]]:
    with torch.inference_mode():
        return sweep(model, torch.contiguous_format)


def build() -> torch.nn.Module:
    return DetectionModel("yolo11n.yaml", nc=5, verbose=False).cuda().fuse().half().eval()


def main() -> None:
    mode = sys.argv[1]
    torch.backends.cudnn.enabled = mode != "nocudnn"
    torch.backends.cudnn.benchmark = mode == "benchmark"
    started = time.perf_counter()
    model = build()
    out: dict = {"mode": mode, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    out["build_s"] = round(time.perf_counter() - started, 2)
    if mode == "thread":
        other: dict = {}
        worker = threading.Thread(target=lambda: other.update(_in_inference(model)))
        worker.start()
        worker.join()
        out["other_thread"] = other
        with torch.inference_mode():
            out["main_thread_after"] = sweep(model, torch.contiguous_format)
        print(json.dumps(out))
        return
    with torch.inference_mode():
        out["model1"] = sweep(model, torch.contiguous_format)
        out["model2"] = sweep(copy.deepcopy(model), torch.contiguous_format)
        out["model2_channels_last"] = sweep(model.to(memory_format=torch.channels_last), torch.channels_last)
    out["shapes"] = SHAPES
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""The GPU-only limit: the model's own training step on random tensors, no loader (eager, or with CUDA graphs),
under one kernel mode."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from yolo_ray.bench.variant_run import BenchSettings


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
    batch = random_batch(b, s.imgsz, dev, channels_last)

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


def random_batch(b: int, imgsz: int, dev: Any, channels_last: bool, boxes: int = 6) -> dict[str, Any]:
    """Random images and `boxes` random targets an image, as Ultralytics' loss reads a batch."""
    import torch

    imgs = torch.rand(b, 3, imgsz, imgsz, device=dev)
    if channels_last:
        imgs = imgs.contiguous(memory_format=torch.channels_last)
    return {
        "img": imgs,
        "batch_idx": torch.arange(b, device=dev).repeat_interleave(boxes).float(),
        "cls": torch.randint(0, 3, (b * boxes, 1), device=dev).float(),
        "bboxes": torch.rand(b * boxes, 4, device=dev) * 0.5 + 0.25,
    }

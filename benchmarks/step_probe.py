"""Where a device-loader training step's time goes, without the profiler's overhead: wall-clock timing of the
model's own step with each piece of Ultralytics' loop added in turn, and of the batch augmentation alone.

    python benchmarks/step_probe.py [--batches 64,256] [--model yolo11n.yaml] [--json out.json]
    torchrun --nproc-per-node 2 benchmarks/step_probe.py ...     # the same on 2 processes: DDP and independent
    python benchmarks/step_probe.py --ray 2 ...                   # the same inside Ray Train workers

With several processes each row is timed three times: each rank stepping its own model (what the processes cost
each other: host contention), then under DDP as Ultralytics wraps it and as yolo_ray does (what coupling the ranks
costs, and what yolo_ray's DDP options save). Under torchrun vs under Ray the difference is Ray's worker environment.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook


def make_cache(n: int, s: int, dev: torch.device):
    from yolo_ray.data.device_cache import DeviceCache, Labels

    g = torch.Generator(device="cpu").manual_seed(0)
    images = torch.randint(0, 255, (n, s, s, 3), dtype=torch.uint8, generator=g).to(dev)
    hw = torch.full((n, 2), float(s))
    hw[: n // 2, 0] = s * 0.75  # half the images landscape, as load_image leaves them
    k = 6
    xy = torch.rand(n, k, 2, generator=g) * s * 0.6
    wh = 20 + torch.rand(n, k, 2, generator=g) * s * 0.3
    boxes = torch.cat([xy, torch.minimum(xy + wh, hw[:, None, [1, 0]])], -1)
    cls = torch.randint(0, 3, (n, k), generator=g).float()
    valid = torch.ones(n, k, dtype=torch.bool)
    return DeviceCache(images, hw.to(dev), Labels(boxes, cls, valid, None).to(dev))


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, steps: int, dev: torch.device) -> float:
    for _ in range(3):
        fn()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(dev)
    return (time.perf_counter() - t0) * 1000 / steps


DDP_VARIANTS = ("ultralytics", "yolo_ray", "yolo_ray_fp16_grads")  # DDP as each wraps the model, and one idea


def ddp_options(variant: str) -> dict:
    """DDP's keyword arguments as the trainer passes them. Ultralytics turns off the per-forward buffer sync
    (`forward_sync_buffers` from torch 2.13, `broadcast_buffers` before); yolo_ray keeps that and adds DDP_OPTIONS."""
    from ultralytics.utils.torch_utils import TORCH_2_13  # imports Ultralytics: after ultralytics_env.setup()

    from yolo_ray.worker.trainer import DDP_OPTIONS

    no_buffer_sync = {"forward_sync_buffers" if TORCH_2_13 else "broadcast_buffers": False}
    if variant == "ultralytics":
        return {"find_unused_parameters": True, **no_buffer_sync}
    return {**DDP_OPTIONS, **no_buffer_sync}


def allreduce_ms(numel: int, steps: int, dev: torch.device) -> float:
    """One all-reduce of a gradient-sized fp32 tensor: what the transport (NVLink, shared memory, sockets) costs."""
    t = torch.ones(numel, device=dev)
    return timed(lambda: dist.all_reduce(t), steps, dev)


def probe(
    cache, model_cfg: str, b: int, steps: int, dev: torch.device, ddp: str = "", graphs: bool = False
) -> dict[str, float]:
    """ms per step at batch b: augmentation alone (fused, reference), then the model's step with each piece of
    Ultralytics' loop added: clip + EMA, the progress bar's per-step sync, the augmentation of a fresh batch.
    With graphs the model's forward and backward replay CUDA graphs (yolo_ray.worker.cuda_graphs) and the loss runs
    apart,
    as Ultralytics' loop does for a wrapped model."""
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG
    from ultralytics.utils.torch_utils import ModelEMA

    from yolo_ray.data.device_augment import AugmentHyp, augment_batch
    from yolo_ray.worker.cuda_graphs import GraphedModel

    hyp, cuda = AugmentHyp(), dev.type == "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(0)
    model = DetectionModel(model_cfg, nc=3, verbose=False).to(dev).to(memory_format=torch.channels_last)
    model.args = DEFAULT_CFG
    model.train()
    idx = torch.randint(0, len(cache), (b,), device=dev)
    fixed = augment_batch(cache, idx, hyp, g)
    net = model
    if graphs:  # captured before any DDP wrap, as the trainer does
        sample = (fixed[0].float() / 255).contiguous(memory_format=torch.channels_last)
        net = GraphedModel(model).capture(sample, torch.float16)
    if ddp:
        ids = [dev.index] if dev.type == "cuda" else None
        net = torch.nn.parallel.DistributedDataParallel(net, device_ids=ids, **ddp_options(ddp))
        if ddp.endswith("fp16_grads"):  # gradients travel as fp16: half the bytes
            net.register_comm_hook(None, fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9, nesterov=True)
    scaler = torch.amp.GradScaler(dev.type, enabled=cuda)
    ema = ModelEMA(model)

    def step(aug: bool = False, full: bool = False, sync: bool = False) -> None:
        img, targets = augment_batch(cache, torch.randint(0, len(cache), (b,), device=dev), hyp, g) if aug else fixed
        batch = {"img": (img.float() / 255).contiguous(memory_format=torch.channels_last), **targets}
        with torch.autocast(dev.type, dtype=torch.float16, enabled=cuda):
            loss, items = model.loss(batch, net(batch["img"])) if graphs else net(batch)
        scaler.scale(loss.sum()).backward()
        if full:  # BaseTrainer.optimizer_step
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if full:
            ema.update(model)
        if sync:  # Ultralytics' progress bar formats the losses every step
            " ".join(f"{float(v):g}" for v in items.values())

    # the host side of the step: intra-op threads and the CPUs this process may run on
    r: dict[str, float] = {"batch": b, "ddp": ddp or "none", "graphs": graphs, "threads": torch.get_num_threads()}
    r["cpus"] = len(os.sched_getaffinity(0))
    r["augment_ms"] = timed(lambda: augment_batch(cache, idx, hyp, g), steps, dev)
    r["augment_reference_ms"] = timed(lambda: augment_batch(cache, idx, hyp, g, fused=False), steps, dev)
    r["ceiling_step_ms"] = timed(step, steps, dev)
    r["plus_clip_ema_ms"] = timed(lambda: step(full=True), steps, dev)
    r["plus_pbar_sync_ms"] = timed(lambda: step(full=True, sync=True), steps, dev)
    r["plus_augment_ms"] = timed(lambda: step(aug=True, full=True, sync=True), steps, dev)
    r["no_sync_with_augment_ms"] = timed(lambda: step(aug=True, full=True), steps, dev)
    if ddp:
        r["allreduce_grads_ms"] = allreduce_ms(sum(p.numel() for p in model.parameters()), steps, dev)
    for k in [k for k in r if k.endswith("_ms")]:
        r[k] = round(r[k], 2)
        if k.startswith(("ceiling", "plus", "no_sync")) and r[k] > 0:
            r[k.replace("_ms", "_img_s")] = round(b * 1000 / r[k], 1)
    return r


def run(a: argparse.Namespace, dev: torch.device) -> list[dict[str, float]]:
    """Every batch size; with several processes, each once independent and once under DDP."""
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    # by name: Ray pickles this script's functions by value, and the torch.backends.cudnn object does not pickle
    importlib.import_module("torch.backends.cudnn").benchmark = True
    cache = make_cache(256 if dev.type == "cpu" else 1024, a.imgsz, dev)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rows = []
    graphs = [False, True] if dev.type == "cuda" else [False]
    variants = [("", g) for g in graphs]
    if world > 1:  # each rank alone, then coupled by DDP
        variants = [("", False), *((ddp, False) for ddp in DDP_VARIANTS), *(("yolo_ray", True) for _ in graphs[1:])]
    for b in map(int, a.batches.split(",")):
        for ddp, graphed in variants:
            rows.append({"processes": world, **probe(cache, a.model, b, a.steps, dev, ddp, graphed)})
            if not dist.is_initialized() or dist.get_rank() == 0:
                print(json.dumps(rows[-1]), flush=True)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _ray_worker(config: dict) -> None:
    import ray.train

    rows = run(argparse.Namespace(**config), ray.train.torch.get_device())
    if ray.train.get_context().get_world_rank() == 0:  # a result carries metrics only with a checkpoint: a file
        Path(config["rows_path"]).write_text(json.dumps(rows))


def run_in_ray(a: argparse.Namespace, workers: int) -> list[dict[str, float]]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cuda = torch.cuda.is_available() and not a.device.startswith("cpu")
    out = Path("benchmarks/runs").resolve()
    rows_path = out / "step_probe_rows.json"
    rows_path.unlink(missing_ok=True)
    ray.init(include_dashboard=False)
    TorchTrainer(
        _ray_worker,
        train_loop_config={**vars(a), "rows_path": str(rows_path)},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=cuda),
        run_config=RunConfig(name="step_probe", storage_path=str(out)),
    ).fit()
    return [{**r, "launcher": "ray"} for r in json.loads(rows_path.read_text())]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--model", default="yolo11n.yaml")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda (this process's local rank) or cpu")
    ap.add_argument("--ray", type=int, default=0, help="run inside N Ray Train workers instead")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    if a.ray:
        rows = run_in_ray(a, a.ray)
    else:
        cuda = a.device.startswith("cuda")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun
            dist.init_process_group("nccl" if cuda else "gloo")
        dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(dev)
        rows = [{**r, "launcher": "torchrun" if dist.is_initialized() else "none"} for r in run(a, dev)]
        if dist.is_initialized():
            rank = dist.get_rank()
            dist.destroy_process_group()
            if rank:
                return
    if a.json:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        Path(a.json).write_text(json.dumps({"gpu": gpu, "model": a.model, "imgsz": a.imgsz, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

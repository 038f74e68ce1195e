"""What the driver hands every Ray Train worker: one frozen plan, built once on the driver from the config and the
resolved cluster (launcher.plan_workers), read by worker.train_loop_per_worker. A new worker setting is a field here,
where the driver sets it and where the worker reads it; nothing is recomputed in between. No heavy imports: the
driver builds it before any worker exists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from yolo_ray import batch_plan
from yolo_ray.config_schema import ULTRALYTICS_GRAD_CLIP
from yolo_ray.faults import FaultPlan
from yolo_ray.user_callbacks import UserCallback


@dataclass(frozen=True)
class ValAsyncSettings:
    """train.val_async: where the validator runs (worker/async_val.py)."""

    runner: str = "thread"  # thread: a thread of rank 0's process, its own CUDA stream; actor: a Ray actor of its own
    gpus: float = 0.0
    cpus: float = 1.0
    fail_at_epoch: int | None = None  # fault injection: validating this (0-based) epoch fails, once (Validator)
    cuda_graphs: bool = False  # train.val_cuda_graphs: the forward on its GPU replayed (worker/val_graphs.py)


@dataclass(frozen=True)
class StreamPlan:
    """data.loader=stream: what a rank needs to know of the split Ray Data serves it."""

    images: int  # the train split's images
    rows: int  # rows once padded to a multiple of the workers (each epoch serves them all, equally split)
    buffer: int  # data.stream_buffer: the ring's rows (0: Ultralytics' mosaic-buffer rule, stream_loader.ring_size)
    decode: str = "ray"  # who decodes: ray (Ray Data's tasks: pixels arrive), worker (OpenCV processes here), device
    decode_threads: int = 1  # worker/device: this rank's whole CPUs (scaling.cpus_per_worker): decoding processes
    # (worker: one fewer, for the training thread) or OpenCV threads (device's PNGs)


@dataclass(frozen=True)
class BatchRule:
    """The global batch, split anew at each (re)start for the group's size then (an elastic group resizes)."""

    batch: int
    accumulate: int | None  # None: Ultralytics' own rule (fixed groups only)
    max_world: int

    def at(self, world: int) -> batch_plan.WorkerBatch | None:
        """The split at `world` workers (None: Ultralytics' own rule decides)."""
        return None if self.accumulate is None else batch_plan.plan(self.batch, self.accumulate, world, self.max_world)

    def per_worker(self, world: int) -> int:
        """Images a worker takes each step in a group of `world` workers."""
        split = self.at(world)
        return max(1, self.batch // world) if split is None else split.per_worker

    def ultralytics(self, world: int) -> dict[str, int]:
        """Ultralytics' batch/nbs for a group of `world` workers (empty: its own rule decides)."""
        split = self.at(world)
        return {} if split is None else split.ultralytics()


@dataclass(frozen=True)
class WorkerPlan:
    overrides: dict[str, Any]  # Ultralytics' trainer arguments (inputs.ultralytics_overrides), device set per worker
    run_dir: str
    batch: BatchRule
    loader: str = "ultralytics"  # data.loader
    device_cache: str = "auto"
    sync_bn: bool = False
    channels_last: bool = False
    cuda_graphs: bool = False
    val_cuda_graphs: bool = False
    grad_clip: float = ULTRALYTICS_GRAD_CLIP  # train.grad_clip (worker/grad_norms.py)
    profile_steps: int = 0
    fault: FaultPlan = field(default_factory=FaultPlan)
    val_async: ValAsyncSettings | None = None  # None: inline validation
    stream: StreamPlan | None = None
    export: bool = False  # rank 0 exports best.pt to ONNX (MLflow registers it)
    callbacks: tuple[UserCallback, ...] = ()
    verbose: bool = False

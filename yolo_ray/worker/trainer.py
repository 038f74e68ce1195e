"""Ultralytics' trainers, adapted at their seams to run inside a Ray Train worker.

One adaptation (RayTrainer) for all five tasks: `trainer_class(task)` puts it in front of Ultralytics' own
DetectionTrainer, SegmentationTrainer, PoseTrainer, OBBTrainer or ClassificationTrainer (tasks.py).

Everything Ultralytics' in-process DDP path already does right stays as it is: the DDP wrap, DistributedSampler
shards, per-rank batch = batch // world_size, loss scaling, EMA buffer broadcast before validation, sharded validation
gathered to rank 0, rank-0-only saving, the early-stop broadcast. What changes:

- world size is Ray's global one (Ultralytics counts this process's devices) and no `torch.distributed.run`
  subprocess is ever spawned;
- the process group already exists (Ray made it): `_setup_ddp` only pins the device Ray gave this worker;
- DDP on CPU gets no `device_ids` (Ultralytics passes `[None]`, which DDP rejects), and sync-BN converts the model
  right before the wrap;
- the per-epoch checkpoint is Ultralytics' save_model run on a host snapshot by a writer thread
  (worker/checkpoint_writer.py), not on the training thread while every rank waits;
- optionally the train loader is yolo_ray's DeviceLoader (decoded images on the device, batched augmentation there),
  the model and inputs use channels_last memory, and the model's forward and backward replay CUDA graphs (through
  Ultralytics' seam for compiled models: `attempt_compile` returns the wrapper, the loop computes the loss apart);
- the gradients are clipped at train.grad_clip (Ultralytics' fixed 10.0 by default) and each step's norm is kept
  for the epoch's record (worker/grad_norms.py).

Must be imported inside the worker, after Ray has set RANK / LOCAL_RANK / WORLD_SIZE.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from ultralytics.engine.trainer import BaseTrainer
from ultralytics.utils.patches import override_configs
from ultralytics.utils.torch_utils import get_torch_device_backend, torch_distributed_zero_first, unwrap_model

from yolo_ray import run_layout as layout
from yolo_ray import tasks
from yolo_ray.config_schema import ULTRALYTICS_GRAD_CLIP
from yolo_ray.console import say
from yolo_ray.worker import batched_val, val_batches
from yolo_ray.worker.checkpoint_writer import CheckpointWriter, weights_digest
from yolo_ray.worker.grad_norms import GradNorms
from yolo_ray.worker.inline_val_thread import InlineValThread, OnInlineValThread
from yolo_ray.worker.val_graphs import EvalGraphs
from yolo_ray.worker_plan import StreamPlan


def trainer_class(task: str) -> type[RayTrainer]:
    """RayTrainer in front of the task's Ultralytics trainer: its dataset, model, loss and validator, Ray's ranks."""
    base = tasks.trainer_base(task)
    return type(f"Ray{base.__name__}", (RayTrainer, base), {})


class RayTrainer(BaseTrainer):
    """The seams of an Ultralytics trainer, taken over so its processes, world size and device come from Ray Train.
    Used through trainer_class(task), in front of the task's trainer (BaseTrainer here names the methods it
    overrides; the task's class comes after it in the MRO)."""

    def __init__(
        self,
        overrides: dict,
        *,
        nbs: int | None = None,
        device: torch.device,
        world_size: int,
        sync_bn: bool = False,
        loader: str = "ultralytics",
        device_cache: str = "auto",
        channels_last: bool = False,
        cuda_graphs: bool = False,
        val_cuda_graphs: bool = False,
        grad_clip: float = ULTRALYTICS_GRAD_CLIP,
        val_async: bool = False,
        stream: StreamPlan | None = None,
    ):
        self.ray_device = device
        self.stream = stream  # data.loader=stream (worker_plan.StreamPlan)
        self.sync_bn = sync_bn
        self.loader = loader
        self.device_cache = device_cache
        self.channels_last = channels_last
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self.in_final_eval = False
        self.grad_norms = GradNorms(grad_clip)  # each step's clipping and norm (worker/grad_norms.py)
        self.val_async = val_async  # validation beside training (worker/async_val.py); rank 0 holds `async_val`
        self.async_val: Any = None
        self._val_timed: tuple[int, float] | None = None  # (epoch, seconds) of the latest validation
        self.val_thread: InlineValThread | None = None  # inline validation on a GPU (worker/inline_val_thread.py)
        # its forward replayed as CUDA graphs (worker/val_graphs.py): made with the val thread
        self.val_graphs: EvalGraphs | None = None
        self.val_cuda_graphs = val_cuda_graphs and device.type == "cuda"
        self.shard_indices: list[int] = []
        super().__init__(overrides=overrides)  # Ultralytics' init_seeds sets the kernel mode from `deterministic`
        if nbs is not None:  # on resume Ultralytics restores nbs from last.pt; the group may have another size now
            self.args.nbs = nbs
        if not self.args.deterministic and device.type == "cuda":
            # Ultralytics leaves cuDNN's autotuner off (it breaks AutoBatch, which yolo_ray never uses); training
            # batches keep one shape, so cuDNN times its kernels once per shape and keeps the fastest
            torch.backends.cudnn.benchmark = True
        self.world_size = world_size  # global, from Ray
        self.ddp = False  # never spawn torch.distributed.run: Ray owns the processes
        self.writer = CheckpointWriter(self, BaseTrainer.save_model, keep_for_validation=val_async)
        self.add_callback("on_train_epoch_start", _set_sampler_epoch)
        self.add_callback("on_train_epoch_start", lambda t: t.grad_norms.reset())  # rank 0 reads them
        self.add_callback("on_train_start", _warm_validation)

    def _setup_ddp(self) -> None:
        """Ray already called init_process_group; only pin this worker's device."""
        self.device = self.ray_device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            self.accelerator = get_torch_device_backend(self.device)

    def _setup_train(self) -> None:
        with _ray_ddp(sync_bn=self.sync_bn), _graphed_compile(self):
            super()._setup_train()

    def _build_train_pipeline(self) -> None:
        super()._build_train_pipeline()
        sampler = self.train_loader.sampler
        if hasattr(sampler, "set_epoch"):  # record this rank's shard of epoch 0, for checks and debugging
            sampler.set_epoch(0)
            self.shard_indices = [int(i) for i in sampler]

    def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train") -> Any:
        if mode == "train" and self.loader == "stream":
            return self._stream_loader(batch_size)
        if mode != "train":  # the val split: its batches stay on the GPU after the first validation
            return val_batches.on_device(super().get_dataloader(dataset_path, batch_size, rank, mode), self.device)
        if self.loader != "device":
            return super().get_dataloader(dataset_path, batch_size, rank, mode)
        from yolo_ray.data import device_loader

        # the device cache replaces Ultralytics' RAM/disk cache; labels *.cache are written once per node
        with torch_distributed_zero_first(rank), override_configs(self.args, overrides={"cache": False}):
            dataset = self.build_dataset(dataset_path, "train", batch_size)
        grank, world = (dist.get_rank() if dist.is_initialized() else 0), max(self.world_size, 1)
        sharded = self._sharded_cache(len(dataset))
        return device_loader.DeviceLoader.build(dataset, self.args, self.device, batch_size, grank, world, sharded)

    def _stream_loader(self, batch_size: int) -> Any:
        """This rank's shard of the Ray Dataset the launcher handed TorchTrainer (data.loader=stream)."""
        import ray.train

        from yolo_ray.data import device_augment, stream_loader

        return stream_loader.StreamLoader(
            ray.train.get_dataset_shard("train"),
            images=self.stream.images,
            rows=self.stream.rows,
            batch_size=batch_size,
            rank=dist.get_rank() if dist.is_initialized() else 0,
            world_size=max(self.world_size, 1),
            hyp=device_augment.AugmentHyp.from_args(self.args),
            seed=self.args.seed,
            device=self.device,
            imgsz=self.args.imgsz,
            ring_rows=self.stream.buffer,
            record_dir=layout.stream_records(Path(self.save_dir).parent),
            decode=self.stream.decode,
            decode_threads=self.stream.decode_threads,
            epochs=self.args.epochs,
        )

    def get_validator(self) -> Any:
        return batched_val.batched(super().get_validator())

    def plot_training_labels(self) -> None:
        if self.loader == "stream":  # the plots need every label file, which the stream reads only as it goes
            return
        super().plot_training_labels()

    def _sharded_cache(self, images: int) -> bool:
        """data.device_cache: `auto` shards only when a full copy does not fit on every rank; all ranks agree (a
        mixed group would sample overlapping images)."""
        from yolo_ray.data.device_cache import fits as fits_on_device

        if self.device_cache != "auto" or self.world_size <= 1:
            return self.device_cache == "sharded"
        fits = torch.tensor([int(fits_on_device(images, self.args.imgsz, self.device))], device=self.device)
        if dist.is_initialized():
            dist.all_reduce(fits, op=dist.ReduceOp.MIN)
        sharded = not bool(fits.item())
        if sharded and dist.get_rank() == 0:
            say(f"[yolo_ray] data.device_cache=auto: {images} images do not fit on every rank: sharded")
        return sharded

    def _close_dataloader_mosaic(self) -> None:
        if self.loader in ("device", "stream"):  # yolo_ray's loaders, which augment on the device
            self.train_loader.close_mosaic()
        else:
            super()._close_dataloader_mosaic()

    def get_model(self, cfg: Any = None, weights: Any = None, verbose: bool = True) -> nn.Module:
        model = super().get_model(cfg, weights, verbose)
        # channels_last before the DDP wrap and EMA copy, so both inherit it (cuDNN's fast NHWC kernels under AMP)
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def optimizer_step(self) -> None:
        """Ultralytics' step, clipping at train.grad_clip and keeping the norm it measured."""
        with self.grad_norms.clipping():
            super().optimizer_step()

    def preprocess_batch(self, batch: dict) -> dict:
        batch = super().preprocess_batch(batch)
        if self.channels_last:
            batch["img"] = batch["img"].contiguous(memory_format=torch.channels_last)
        return batch

    def validate(self) -> tuple[dict | None, float | None]:
        """Ultralytics' per-epoch validation, timed: with large batches it can cost more than the epoch's training.
        With train.val_async rank 0 hands the epoch to its validator instead (fitness None: Ultralytics' stopper and
        best.pt wait for the result, worker/async_val.py applies it); the other ranks go straight on."""
        if self.val_async and not self.in_final_eval:
            if self.async_val is not None:
                return self.async_val.epoch_end()
            return dict(self.metrics or {}), None
        started = time.perf_counter()
        graphs = self.val_graphs.installed(self.ema.ema) if self.val_graphs and self.ema else contextlib.nullcontext()
        try:
            with graphs:
                if self.val_thread is not None:
                    return self.val_thread.run(super().validate)
                return super().validate()
        finally:
            self._val_timed = (self.epoch, time.perf_counter() - started)

    @property
    def val_seconds(self) -> float | None:
        """This epoch's validation seconds; None when this epoch did not validate."""
        if self._val_timed is None or self._val_timed[0] != self.epoch:
            return None
        return self._val_timed[1]

    def save_model(self) -> bool:
        """Rank 0's checkpoint: snapshot now, written by the writer thread. Ultralytics then fires on_model_save
        before the file exists; yolo_ray waits for it through `writer.saved(epoch)` (nothing listens to that event)."""
        if self.writer.save():
            return True
        # the EMA holds a non-finite value: Ultralytics' own save repairs the live EMA from the model, so run it here
        self.writer.flush()
        self.last.unlink(missing_ok=True)  # a new file: an earlier epoch's staged link keeps its own bytes
        fitness = self.fitness
        if self.val_async:
            self.fitness = float("nan")  # best.pt waits for this epoch's validation (worker/async_val.py)
        try:
            super().save_model()
        finally:
            self.fitness = fitness
        self.writer.adopt(self.epoch)
        return True

    def final_eval(self) -> None:
        # Every rank validates best.pt if it exists when final_eval starts: rank 0's writer must have written it
        # before any rank looks (a rank that sees none skips a validation with collectives in it; the others hang).
        self.writer.flush()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        self.in_final_eval = True  # callbacks fired here are not a training epoch
        try:
            with _cpu_final_val(self), _final_val_as_trained(self), _atomic_strip():
                super().final_eval()
        finally:
            self.in_final_eval = False
            if self.val_thread is not None:
                self.val_thread.close()
                self.val_thread = None

    def parameter_digest(self, as_saved: bool = False) -> str:
        """SHA-256 of the trained parameters (not buffers: BN running stats are per rank, as upstream); as_saved:
        rounded to fp16 as last.pt stores them (a resumed model's weights are exactly those values)."""
        return weights_digest(unwrap_model(self.model), as_saved=as_saved)


def _warm_validation(trainer: RayTrainer) -> None:
    """On a GPU, inline validation gets its own thread, which starts building cuDNN's plans for the val shapes now,
    and compiling the NMS kernel, beside training (worker/inline_val_thread.py). After _setup_train: CUDA graphs are
    captured (no other thread may launch work during a capture)."""
    if trainer.device.type != "cuda" or trainer.val_async or trainer.validator is None or trainer.ema is None:
        return
    model = copy.deepcopy(unwrap_model(trainer.ema.ema)).eval()  # the EMA's layout; its values do not matter
    trainer.val_thread = InlineValThread(trainer.device)
    batched = isinstance(trainer.validator, batched_val.BatchedDetectionValidator)
    nms = functools.partial(batched_val.warm_kernel, trainer.device) if batched else None
    trainer.val_thread.warm(model, trainer.validator.dataloader, half=bool(trainer.amp), then=nms)
    if trainer.val_cuda_graphs:
        trainer.val_graphs = EvalGraphs()


def _set_sampler_epoch(trainer: RayTrainer) -> None:
    """Every epoch its own shuffle (and, for the device loader, its own augmentation stream, seeded by the epoch).

    Ultralytics calls `sampler.set_epoch` only when its RANK is not -1, and it sets RANK to -1 whenever WORLD_SIZE is
    1: a one-worker run (one GPU) would replay epoch 0's order, and the device loader epoch 0's augmented batches,
    in every epoch. Idempotent where Ultralytics sets it too (several workers)."""
    sampler = getattr(trainer.train_loader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(trainer.epoch)


# How yolo_ray's DDP differs from Ultralytics' (find_unused_parameters=True, per-parameter gradient copies): the
# training graph is the same at every step, so the unused parameters are found once, in the first iteration, not by
# a walk of the autograd graph after every forward; and gradients live in the all-reduce buckets, so the reducer
# does not copy and scale each parameter's gradient into a bucket (two kernels per parameter per step). Both are
# host work, which a 64-image YOLO11n step on an H200 is bound by.
DDP_OPTIONS = {"static_graph": True, "find_unused_parameters": False, "gradient_as_bucket_view": True}


class _RayDDP(nn.parallel.DistributedDataParallel):
    """DDP as Ultralytics builds it, plus CPU (gloo) support, optional SyncBatchNorm and DDP_OPTIONS."""

    sync_bn = False

    def __init__(self, module: nn.Module, device_ids: list | None = None, **kwargs):
        if self.sync_bn:
            module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        on_cpu = next(module.parameters()).device.type == "cpu"
        kwargs.update(DDP_OPTIONS)
        super().__init__(module, device_ids=None if on_cpu else device_ids, **kwargs)


@contextlib.contextmanager
def _cpu_final_val(trainer: RayTrainer) -> Iterator[None]:
    """On CPU each rank validates best.pt alone, as an undistributed (rank -1) validator.

    Ultralytics' distributed standalone validation puts every rank > -1 on CUDA. The val set is small next to
    training, so validating it whole on each CPU rank costs little; only rank 0 writes plots.
    """
    from ultralytics.utils import RANK

    if trainer.device.type != "cpu":
        yield
        return
    saved = trainer.validator.dataloader, trainer.args.plots
    trainer.validator.dataloader = None  # rebuilt whole, not this rank's shard
    trainer.args.plots = trainer.args.plots and RANK == 0
    try:
        with undistributed_validation():
            yield
    finally:
        trainer.validator.dataloader, trainer.args.plots = saved


@contextlib.contextmanager
def _final_val_as_trained(trainer: RayTrainer) -> Iterator[None]:
    """On a GPU, final_eval's model (best.pt, fused) runs in the memory layout training validated in, and without
    AutoBackend's warm-up.

    cuDNN builds an execution plan per (input shape, memory layout) the first time a thread meets one, ~1-2.5 s
    each for YOLO11n (benchmarks/conv_first_call_probe.py). final_eval validates the same rect batch shapes as the
    epochs did, so reloading best.pt in the same layout reuses every plan; Ultralytics' default reload is NCHW while
    training ran channels_last (its own default on CUDA), and its warm-up pass is at (1, 3, imgsz, imgsz), a shape
    the val batches never have: both only build plans. With a validation thread (worker/inline_val_thread.py)
    best.pt is validated on it: PyTorch keeps cuDNN's plans per thread."""
    from ultralytics.nn.autobackend import AutoBackend

    if trainer.device.type != "cuda" or trainer.validator is None:
        yield
        return
    validator, warmup = trainer.validator, AutoBackend.warmup
    saved = validator.args.channels_last
    model = unwrap_model(trainer.ema.ema if trainer.ema else trainer.model)
    validator.args.channels_last = _layout(model) is torch.channels_last
    AutoBackend.warmup = lambda self, *a, **k: None
    if getattr(trainer, "val_thread", None) is not None:  # on the thread that holds the epochs' plans
        trainer.validator = OnInlineValThread(validator, trainer.val_thread)
    try:
        yield
    finally:
        trainer.validator = validator
        validator.args.channels_last, AutoBackend.warmup = saved, warmup


@contextlib.contextmanager
def _atomic_strip() -> Iterator[None]:
    """Ultralytics' final_eval strips the optimizer from last.pt and best.pt by rewriting them in place: a driver
    killed mid-write left a truncated best.pt that the re-run, finishing the run, could not load. Here each stripped
    file is written beside its original and renamed over it, so a kill leaves the old file or the new one."""
    import ultralytics.engine.trainer as engine

    strip = engine.strip_optimizer

    def atomic(f: str | Path, s: str = "", updates: dict | None = None) -> dict:
        target = Path(s or f)
        staged = target.with_name(f".{target.name}.stripping")
        staged.unlink(missing_ok=True)
        ckpt = strip(f, s=str(staged), updates=updates)
        if staged.exists():  # strip_optimizer writes nothing for a file it cannot read
            os.replace(staged, target)
        return ckpt

    engine.strip_optimizer = atomic
    try:
        yield
    finally:
        engine.strip_optimizer = strip


@contextlib.contextmanager
def undistributed_validation() -> Iterator[None]:
    """Ultralytics' validators on this rank see RANK -1: each rank validates the whole split alone, no collective in
    the validation itself (its dataset set-up still holds one barrier for all ranks: every rank must validate)."""
    import ultralytics.engine.validator as base_val
    import ultralytics.models.yolo.classify.val as classify_val
    import ultralytics.models.yolo.detect.val as detect_val  # segment, pose and obb validators subclass it

    modules = (base_val, detect_val, classify_val)
    saved = [m.RANK for m in modules]
    for m in modules:
        m.RANK = -1
    try:
        yield
    finally:
        for m, rank in zip(modules, saved, strict=True):
            m.RANK = rank


GRAPHS_COMPILE_MARK = "yolo_ray.cuda_graphs"  # args.compile while graphs are on (a mark kept in last.pt: unchanged)


@contextlib.contextmanager
def _graphed_compile(trainer: RayTrainer) -> Iterator[None]:
    """With cuda_graphs, Ultralytics' compile step wraps the model in GraphedModel instead of torch.compile, and
    `args.compile` set makes its loop call the wrapper for predictions and the model's loss apart.

    `args.compile` is saved in last.pt and a resume restores it, so it holds a mark of its own: a graphed run resumed
    with graphs off must not become a torch.compile run (and native Ultralytics, given an unknown mode, stays eager).
    """
    import ultralytics.engine.trainer as base_trainer

    if not trainer.cuda_graphs:
        if trainer.args.compile == GRAPHS_COMPILE_MARK:
            trainer.args.compile = False
        yield
        return
    from yolo_ray.worker.cuda_graphs import GraphedModel

    def graphed(model: nn.Module, **_: Any) -> GraphedModel:  # before the DDP wrap, on a batch of this rank's shape
        args, dev = trainer.args, trainer.device
        sample = torch.rand(args.batch // max(trainer.world_size, 1), 3, args.imgsz, args.imgsz, device=dev)
        amp = None if args.amp in {False, "fp32"} else torch.bfloat16 if args.amp == "bf16" else torch.float16
        return GraphedModel(model).capture(sample.contiguous(memory_format=_layout(model)), amp)

    original = base_trainer.attempt_compile
    base_trainer.attempt_compile = graphed
    trainer.args.compile = GRAPHS_COMPILE_MARK  # Ultralytics' loop: predictions from the wrapper, the loss apart
    try:
        yield
    finally:
        base_trainer.attempt_compile = original


def _layout(model: nn.Module) -> torch.memory_format:
    weight = next(model.parameters())
    return torch.channels_last if weight.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format


@contextlib.contextmanager
def _ray_ddp(sync_bn: bool) -> Iterator[None]:
    """Swap in _RayDDP where Ultralytics' _setup_train builds its DDP wrapper (a subclass: isinstance checks hold)."""
    original = nn.parallel.DistributedDataParallel
    ddp_cls = type("RayDDP", (_RayDDP,), {"sync_bn": sync_bn})
    nn.parallel.DistributedDataParallel = ddp_cls
    try:
        yield
    finally:
        nn.parallel.DistributedDataParallel = original

"""The experiment config's schema: five sections (model, data, train, scaling, run) plus `tracking` and `tune`, every
key typed and defaulted, and ConfigError, the one-paragraph error (file, key, fix) every check raises. Parsing and
overrides live in config.py, the checks in config_checks.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

EMBEDDED = "<embedded default>"


class ConfigError(ValueError):
    """A bad experiment config: one paragraph naming the file, the key and the fix."""

    def __init__(self, source: str, key: str, problem: str, fix: str):
        problem, fix = " ".join(problem.split()), " ".join(fix.split())  # no runs of spaces from wrapped literals
        self.source, self.key, self.problem, self.fix = source, key, problem, fix
        super().__init__(f"{source}: {key}: {problem} Fix: {fix}")


@dataclass
class SyntheticSection:
    """The generated dataset (used when data.path is `synthetic`): `shapes` (square, few large objects: quick, for
    mechanics) or `real` (scenes shaped like real data: sizes, crowds, small objects, occlusion, clutter)."""

    images: int = 384
    imgsz: int = 128
    classes: int = 3
    seed: int = 0
    style: Literal["shapes", "real"] = "shapes"


@dataclass
class DataSection:
    path: str = "synthetic"  # a data.yaml, or `synthetic` to generate one into `dir`
    dir: str = "datasets/shapes"
    synthetic: SyntheticSection = field(default_factory=SyntheticSection)
    # ultralytics: its DataLoader (CPU decode + augmentation in loader processes);
    # device: images decoded once into device memory, whole batches augmented there (yolo_ray/data/device_loader.py)
    # stream: images read through Ray Data (a local split or `train: s3://...`), decoded on its CPUs or the GPU,
    # augmented as `device` does; memory does not grow with the dataset (yolo_ray/data/stream_loader.py)
    loader: Literal["ultralytics", "device", "stream"] = "ultralytics"
    # device loader only. replicated: every worker holds all images (reshuffled across workers each epoch);
    # sharded: each holds a fixed 1/num_workers of them (N workers hold N times more); auto: replicated if that fits
    device_cache: Literal["auto", "replicated", "sharded"] = "auto"
    # the share of a split's images that may be unusable (corrupt, too small, bad label rows): Ultralytics skips them,
    # yolo_ray names them; above it the run is refused before it starts
    max_bad_fraction: float = 0.01
    # stream only. Where images are decoded: cpu (OpenCV in Ray Data tasks, on any node's CPUs: decoded pixels
    # travel), worker (OpenCV in processes of each Train worker: compressed bytes travel), device (JPEG with nvJPEG
    # on the GPU, others with OpenCV threads), auto (decided from the cluster: worker where every node with CPUs to
    # spare has a GPU, cpu where nodes without GPUs can decode, or on CPUs: ray_cluster.with_stream_decode)
    stream_decode: Literal["auto", "device", "cpu", "worker"] = "auto"
    stream_buffer: int = 0  # images kept on the device for mosaic partners; 0: min(images, 8 x batch, 1000)
    s3_endpoint: str = ""  # an S3-compatible server (http://host:port) for `train: s3://...`; "": AWS_ENDPOINT_URL

    def stream_decoder(self) -> str:
        """Who decodes the stream's images: ray (Ray Data's tasks), worker (the Train worker's processes), device."""
        return "ray" if self.stream_decode in ("auto", "cpu") else self.stream_decode


STREAM_READ_CPUS = 2  # of a GPU's CPU share, what data.stream_decode worker leaves Ray Data to read the bytes with
ULTRALYTICS_GRAD_CLIP = 10.0  # the gradient norm BaseTrainer.optimizer_step clips at, fixed in its code


@dataclass
class TrainSection:
    epochs: int = 30
    imgsz: int = 128
    batch: int = 16  # GLOBAL batch: each Ray worker takes batch / num_workers images per step
    accumulate: int | None = 1  # k: optimizer step every k batches; null: Ultralytics' rule round(64 / batch)
    lr0: float = 0.01
    lrf: float = 0.01
    optimizer: Literal["SGD", "MuSGD", "Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSProp", "auto"] = "SGD"
    momentum: float = 0.937
    weight_decay: float = 0.0005
    warmup_epochs: float = 3.0
    # the gradients' largest norm, clipped before each optimizer step (Ultralytics' fixed 10.0; its loss sums over
    # the batch, so the norm grows with the images per step); 0: never clipped. Each epoch records the norms.
    grad_clip: float = ULTRALYTICS_GRAD_CLIP
    cos_lr: bool = False
    amp: bool = True
    sync_bn: bool = False
    channels_last: bool = False  # NHWC model and inputs: faster convolutions under AMP on recent GPUs
    cuda_graphs: bool = False  # the model's forward and backward replayed as CUDA graphs (worker/cuda_graphs.py)
    # validation's forward on a GPU (inline, or val_async's validator) replayed as CUDA graphs, one per val batch shape
    # (worker/val_graphs.py)
    val_cuda_graphs: bool = False
    cache: bool | Literal["ram", "disk"] = False
    workers: int = 2  # data loader processes per Ray worker
    seed: int = 0
    # false: cuDNN autotunes and picks its fastest kernels, and the stream loader takes Ray Data's read blocks as they
    # finish instead of in order (neither bitwise repeatable)
    deterministic: bool = True
    close_mosaic: int = 10
    patience: int = 100
    val: bool = True
    # validate each epoch's EMA weights beside training instead of stopping it (yolo_ray/worker/async_val.py)
    val_async: bool = False
    # where: thread (in rank 0's training process, on a CUDA stream of its own) | actor (a Ray actor of its own)
    val_runner: Literal["thread", "actor"] = "thread"
    val_gpus: float = 0.0  # the validation actor's GPUs: a share (e.g. 0.25, with scaling.gpus_per_worker 0.75), 1
    val_cpus: float = 1.0  # its CPUs (the val loader's processes run in it)
    plots: bool = True
    extra: dict = field(default_factory=dict)  # any other Ultralytics train argument (mosaic, hsv_h, fliplr, ...)
    # users' Ultralytics callbacks by import path, run in every worker: {on_fit_epoch_end: [my_pkg.hooks:fn], ...}
    callbacks: dict = field(default_factory=dict)


@dataclass
class ScalingSection:
    # auto: one per GPU in the cluster, else 2; [min, max]: elastic, the group resizes as nodes come and go
    num_workers: int | Literal["auto"] | list = "auto"
    elastic_resize_interval_s: float = 60.0  # an elastic group considers growing this often
    use_gpu: bool | Literal["auto"] = "auto"  # auto: GPUs when the cluster has them
    # auto: a GPU worker reserves its loader processes + 1 (driver/ray_cluster.py auto_cpus_per_worker); CPU ones 1
    cpus_per_worker: float | Literal["auto"] = "auto"
    gpus_per_worker: float = 1.0
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    autoscaling: bool = False  # true: an autoscaler may add nodes, so skip the "cluster can never fit it" check


@dataclass
class RunSection:
    name: str = "smoke"
    storage_path: str = "runs"  # shared storage on a multi-node cluster (NFS, a mounted volume)
    max_failures: int = 0  # worker-group restarts from the last epoch checkpoint
    max_preemptions: int = -1  # restarts after a node is preempted (drained), counted apart from failures; -1: any
    checkpoints_to_keep: int = 2
    ray_address: str | None = None  # None: RAY_ADDRESS, else a local Ray started for this run
    fail_at_epoch: int | None = None  # fault injection: raise after this epoch's checkpoint (first attempt)
    fail_rank: int = 0
    fail_at_batch: int | None = None  # with fail_at_epoch: fail in the next epoch after this many batches instead
    fail_val_at_epoch: int | None = None  # fault injection (train.val_async): the validator dies on this epoch, once
    profile_steps: int = 0  # > 0: torch.profiler over this many steps of epoch 2 on rank 0 (profile.txt/.json)
    verbose: bool = False  # true: Ray's and Ultralytics' own output too (start-up, tables, per-batch bars)


@dataclass
class TrackingSection:
    enabled: bool = True
    uri: str | None = None  # null: MLFLOW_TRACKING_URI, else sqlite:///<run.storage_path>/mlflow.db
    experiment: str = "yolo_ray"
    register: bool = True  # export best.pt to ONNX and register it in the Model Registry
    model_name: str | None = None  # null: yolo_ray-<run.name>
    alias: str = "candidate"
    tags: dict = field(default_factory=dict)
    outage_grace_s: float = 120.0  # at the end, how long to wait for a tracking server that is down


@dataclass
class TrialSection:
    num_workers: int | list = 1  # [min, max]: elastic trials (the sweep's concurrency counts min)
    # auto: as scaling.cpus_per_worker, within the trial's GPU fraction of its node (0.25 GPU: a quarter of its CPUs)
    cpus_per_worker: float | Literal["auto"] = "auto"
    gpus_per_worker: float = 1.0  # a fraction (e.g. 0.25) lets several single-worker trials share one GPU


@dataclass
class TuneSection:
    metric: str = "mAP50-95"
    mode: Literal["max", "min"] = "max"
    num_samples: int = 8
    search: Literal["optuna", "random", "grid"] = "optuna"
    scheduler: Literal["asha", "none"] = "asha"
    grace_period: int = 2  # epochs every trial runs before ASHA may stop it
    reduction_factor: int = 2
    max_concurrent: int | Literal["auto"] = "auto"  # auto: what the cluster fits at once
    time_budget_s: float | None = None
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"  # lr0 follows batch * accumulate vs reference_batch
    reference_batch: int = 64
    trial: TrialSection = field(default_factory=TrialSection)
    space: dict = field(default_factory=dict)  # {"train.lr0": {"loguniform": [1e-4, 1e-1]}, ...}
    resume: bool = False
    seed: int = 0


@dataclass
class ExperimentConfig:
    model: str = "yolo11n.yaml"  # a YOLO11 yaml (built from scratch) or a local .pt
    # detect, segment, pose, obb or classify; auto: the model's own (yolo11n-seg.yaml is segment), as Ultralytics does
    task: Literal["auto", "detect", "segment", "pose", "obb", "classify"] = "auto"
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    run: RunSection = field(default_factory=RunSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    tune: TuneSection = field(default_factory=TuneSection)
    source: str = field(default=EMBEDDED, metadata={"internal": True})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

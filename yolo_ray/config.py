"""Experiment config: the YAML schema, `key=value` overrides, and checks that need no cluster.

A config has five sections (model, data, train, scaling, run) plus `tracking` and `tune`. Every key is typed; a bad
value raises ConfigError naming the file, the key and the fix, before Ray or a GPU is touched.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

EMBEDDED = "<embedded default>"


class ConfigError(ValueError):
    """A bad experiment config: one paragraph naming the file, the key and the fix."""

    def __init__(self, source: str, key: str, problem: str, fix: str):
        problem, fix = " ".join(problem.split()), " ".join(fix.split())  # no runs of spaces from wrapped literals
        self.source, self.key, self.problem, self.fix = source, key, problem, fix
        super().__init__(f"{source}: {key}: {problem} Fix: {fix}")


@dataclass
class SyntheticData:
    """The generated dataset (used when data.path is `synthetic`): `shapes` (square, few large objects: quick, for
    mechanics) or `real` (scenes shaped like real data: sizes, crowds, small objects, occlusion, clutter)."""

    images: int = 384
    imgsz: int = 128
    classes: int = 3
    seed: int = 0
    style: Literal["shapes", "real"] = "shapes"


@dataclass
class DataConfig:
    path: str = "synthetic"  # a data.yaml, or `synthetic` to generate one into `dir`
    dir: str = "datasets/shapes"
    synthetic: SyntheticData = field(default_factory=SyntheticData)
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
    # stream only. Where images are decoded: cpu (OpenCV in Ray Data tasks, on any node's CPUs), device (JPEG with
    # nvJPEG on the GPU, others with OpenCV in the worker: compressed bytes travel), auto (cpu: faster on one H200)
    stream_decode: Literal["auto", "device", "cpu"] = "auto"
    stream_buffer: int = 0  # images kept on the device for mosaic partners; 0: min(images, 8 x batch, 1000)
    s3_endpoint: str = ""  # an S3-compatible server (http://host:port) for `train: s3://...`; "": AWS_ENDPOINT_URL


@dataclass
class TrainConfig:
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
    cos_lr: bool = False
    amp: bool = True
    sync_bn: bool = False
    channels_last: bool = False  # NHWC model and inputs: faster convolutions under AMP on recent GPUs
    cuda_graphs: bool = False  # the model's forward and backward replayed as CUDA graphs (worker/cuda_graphs.py)
    cache: bool | Literal["ram", "disk"] = False
    workers: int = 2  # data loader processes per Ray worker
    seed: int = 0
    deterministic: bool = True  # false: cuDNN autotunes and picks its fastest kernels (not bitwise repeatable)
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
class TrialScaling:
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
    trial: TrialScaling = field(default_factory=TrialScaling)
    space: dict = field(default_factory=dict)  # {"train.lr0": {"loguniform": [1e-4, 1e-1]}, ...}
    resume: bool = False
    seed: int = 0


@dataclass
class ExperimentConfig:
    model: str = "yolo11n.yaml"  # a YOLO11 yaml (built from scratch) or a local .pt
    # detect, segment, pose, obb or classify; auto: the model's own (yolo11n-seg.yaml is segment), as Ultralytics does
    task: Literal["auto", "detect", "segment", "pose", "obb", "classify"] = "auto"
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    run: RunSection = field(default_factory=RunSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    tune: TuneSection = field(default_factory=TuneSection)
    source: str = field(default=EMBEDDED, metadata={"internal": True})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


# --------------------------------------------------------------------------------------------------- parsing


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """(ok, value) if value fits type tp; ints are accepted where floats are wanted."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp)), value
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _coerce(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads `1e-3` (no dot) as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    if tp is dict:
        return isinstance(value, dict), value
    return isinstance(value, tp), value


def _wants_str(tp: Any) -> bool:
    return tp is str or (typing.get_origin(tp) in (Union, types.UnionType) and str in typing.get_args(tp))


def _build(cls: type, raw: Any, source: str, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(
            source,
            prefix or "<top level>",
            f"expected a mapping, got {raw!r}.",
            f"write `{prefix or 'the file'}` as `key: value` lines.",
        )
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = (
                f"did you mean `{prefix + '.' if prefix else ''}{close[0]}`?"
                if close
                else (f"valid keys here: {', '.join(names)}.")
            )
            raise ConfigError(source, dotted, "unknown key.", f"remove it or rename it; {hint}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, source, dotted)
            continue
        ok, coerced = _coerce(value, tp)
        if not ok:
            fix = f"set `{dotted}` to {_describe(tp)}."
            if _wants_str(tp) and isinstance(value, (bool, int, float)):  # YAML read `yes`, `on`, `1e3` as such
                fix = (
                    f'quote the value to keep it text, e.g. {dotted}=\'"yes"\' on the command line or "yes" in '
                    "YAML (YAML reads yes, no, on and off as booleans, digits as numbers)."
                )
            raise ConfigError(source, dotted, f"{value!r} is not a valid value; expected {_describe(tp)}.", fix)
        kwargs[key] = coerced
    return cls(**kwargs)


def _deep_set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise KeyError(dotted)
    node[parts[-1]] = value


def _scalar(text: str) -> Any:
    """A YAML scalar, with `1e-3` read as a number (PyYAML's YAML 1.1 reads it as a string)."""
    value = yaml.safe_load(text) if text else None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def parse_overrides(items: list[str], source: str = "command line", into: dict | None = None) -> dict:
    """`train.epochs=5 scaling.num_workers=4` set into a nested dict (values parsed as YAML). Each override
    replaces the value at its dotted path, so `tune.space={...}` replaces the whole space."""
    tree: dict = {} if into is None else into
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(source, item, "is not a `key=value` override.", "write overrides as `train.epochs=5`.")
        try:
            _deep_set(tree, key.strip(), _scalar(text))
        except KeyError:
            raise ConfigError(
                source,
                key,
                "sets a key below a value that is not a section.",
                "check the dotted path, e.g. `train.extra.mosaic=0.5`.",
            ) from None
    return tree


def from_dict(raw: dict, source: str) -> ExperimentConfig:
    """An ExperimentConfig from an already-parsed mapping (checked like a file)."""
    cfg = _build(ExperimentConfig, raw, source, "")
    cfg.source = source
    check_static(cfg)
    return cfg


def apply(cfg: ExperimentConfig, dotted: dict[str, Any]) -> ExperimentConfig:
    """A copy of cfg with `{"train.lr0": 0.01, ...}` applied (checked again)."""
    raw = cfg.to_dict()
    for key, value in dotted.items():
        _deep_set(raw, key, value)
    return from_dict(raw, cfg.source)


def load(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load a YAML experiment (or the embedded default when path is None) and apply overrides."""
    raw: dict = {}
    source = EMBEDDED
    if path is not None:
        source = str(path)
        p = Path(path)
        if p.is_dir():
            raise ConfigError(
                source, "<file>", "is a directory.", "pass an experiment YAML such as experiments/smoke.yaml."
            )
        if not p.is_file():
            raise ConfigError(
                source,
                "<file>",
                "the experiment file does not exist.",
                "pass a YAML file such as experiments/smoke.yaml (or none for the embedded default).",
            )
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(source, "<file>", f"is not valid YAML ({e}).", "fix the YAML syntax.") from None
    if overrides:
        from yolo_ray import ultralytics_keys

        where = f"{source} (command-line override)"
        overrides = ultralytics_keys.translate(overrides, where, ultralytics_train_keys() - MANAGED_KEYS)
        raw = parse_overrides(overrides, source=where, into=raw)
    return from_dict(raw, source)


# --------------------------------------------------------------------------------------------------- checks


@functools.cache  # the installed package's file: read once per process, not on every config load
def ultralytics_train_keys() -> frozenset[str]:
    """Keys of Ultralytics' default.yaml, read from the installed package without importing it."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    default = Path(next(iter(spec.submodule_search_locations))) / "cfg" / "default.yaml"
    return frozenset((yaml.safe_load(default.read_text()) or {}).keys())


MAX_IMGSZ = 8192  # one uint8 image at 8192 px is 200 MB: beyond that a typo, not a dataset
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)} - {"extra", "callbacks"}

# Keys yolo_ray sets itself: passing them through train.extra would fight the launcher.
MANAGED_KEYS = {
    "model",
    "data",
    "device",
    "project",
    "name",
    "exist_ok",
    "resume",
    "save_dir",
    "nbs",
    "batch",
    "mode",
    "task",
}


def check_val_async(cfg: ExperimentConfig) -> None:
    """train.val_async's settings, before Ray (the cluster's room for the actor is checked by ray_cluster)."""
    t, s = cfg.train, cfg.source
    if not t.val_async:
        if cfg.run.fail_val_at_epoch is not None:
            raise ConfigError(s, "run.fail_val_at_epoch", "needs train.val_async: true.", "set both, or neither.")
        return
    if not t.val:
        raise ConfigError(
            s,
            "train.val_async",
            "is true but train.val is false: there is no per-epoch validation to move off the training GPUs.",
            "set train.val: true, or train.val_async: false.",
        )
    if t.val_gpus < 0 or t.val_cpus <= 0:
        key = "train.val_gpus" if t.val_gpus < 0 else "train.val_cpus"
        raise ConfigError(s, key, "must be >= 0 (GPUs) / > 0 (CPUs).", "e.g. train.val_gpus: 0.25, train.val_cpus: 2.")
    if t.val_runner == "thread" and t.val_gpus > 0:
        raise ConfigError(
            s,
            "train.val_gpus",
            f"is {t.val_gpus:g}, but train.val_runner is thread: validation runs in the training process, on its GPU.",
            "set train.val_gpus: 0, or train.val_runner: actor for an actor with GPUs of its own.",
        )
    if t.val_gpus > 0 and cfg.scaling.use_gpu is False:
        raise ConfigError(
            s,
            "train.val_gpus",
            f"is {t.val_gpus:g} but scaling.use_gpu is false.",
            "set train.val_gpus: 0 to validate on CPUs, or train on GPUs.",
        )
    f = cfg.run.fail_val_at_epoch
    if f is not None and not 1 <= f <= t.epochs:
        raise ConfigError(s, "run.fail_val_at_epoch", f"{f} is outside 1..epochs ({t.epochs}).", "pick an epoch.")


def check_static(cfg: ExperimentConfig) -> None:
    """Checks that need neither the dataset nor the cluster."""
    _check_train(cfg)
    _check_scaling(cfg)
    _check_run(cfg)
    from yolo_ray import user_callbacks  # imports this module: checked here, defined there

    user_callbacks.parse(cfg.train.callbacks, cfg.source)
    check_gpu_only(cfg, cfg.scaling.use_gpu is not False, "scaling.use_gpu is false")
    check_val_async(cfg)
    check_cuda_graphs(cfg)
    check_device_loader(cfg)
    _check_extra(cfg)
    _check_data(cfg)


def _check_train(cfg: ExperimentConfig) -> None:
    s, t = cfg.source, cfg.train
    if t.epochs < 1:
        raise ConfigError(s, "train.epochs", f"must be >= 1, got {t.epochs}.", "set train.epochs to 1 or more.")
    if t.imgsz > MAX_IMGSZ:
        raise ConfigError(
            s, "train.imgsz", f"{t.imgsz} is beyond {MAX_IMGSZ} px.", f"use a multiple of 32 up to {MAX_IMGSZ}."
        )
    if t.imgsz < 32 or t.imgsz % 32:
        up = max(32, (t.imgsz + 31) // 32 * 32)
        raise ConfigError(
            s,
            "train.imgsz",
            f"{t.imgsz} is not a multiple of 32 (YOLO11's largest stride).",
            f"use {up} or another multiple of 32.",
        )
    if t.batch < 1:
        raise ConfigError(
            s,
            "train.batch",
            f"must be a positive global batch size, got {t.batch}.",
            "set train.batch to the total images per step across all workers, e.g. 32.",
        )
    if t.accumulate is not None and t.accumulate < 1:
        raise ConfigError(
            s,
            "train.accumulate",
            f"must be >= 1, got {t.accumulate}.",
            "set train.accumulate to 1 (no accumulation) or more, or null for Ultralytics' rule.",
        )
    if t.workers < 0:
        raise ConfigError(s, "train.workers", f"must be >= 0, got {t.workers}.", "set train.workers to 0 or more.")


def _check_scaling(cfg: ExperimentConfig) -> None:
    s, sc = cfg.source, cfg.scaling
    if isinstance(sc.num_workers, int):
        if sc.num_workers < 1:
            raise ConfigError(
                s,
                "scaling.num_workers",
                f"must be >= 1, got {sc.num_workers}.",
                "set scaling.num_workers to 1 or more, or `auto`.",
            )
        check_batch_divides(cfg, sc.num_workers)
    trial = cfg.tune.trial.num_workers
    for key, workers in (("scaling.num_workers", sc.num_workers), ("tune.trial.num_workers", trial)):
        if isinstance(workers, list):
            check_worker_range(cfg, key, workers)
    if sc.elastic_resize_interval_s < 0:
        raise ConfigError(s, "scaling.elastic_resize_interval_s", "must be >= 0 seconds.", "set e.g. 60.")
    for key, cpus in (
        ("scaling.cpus_per_worker", sc.cpus_per_worker),
        ("tune.trial.cpus_per_worker", cfg.tune.trial.cpus_per_worker),
    ):
        if cpus != "auto" and cpus <= 0:
            raise ConfigError(s, key, "must be > 0.", "set it to 1 or more, or `auto`.")


def _check_run(cfg: ExperimentConfig) -> None:
    s, t, r = cfg.source, cfg.train, cfg.run
    if r.checkpoints_to_keep < 1:
        raise ConfigError(
            s, "run.checkpoints_to_keep", "must be >= 1 to resume after a failure.", "set it to 1 or more."
        )
    if r.max_failures < -1:
        raise ConfigError(s, "run.max_failures", "must be -1 (retry forever), 0 or more.", "set it to 0 or more.")
    if r.max_preemptions < -1:
        raise ConfigError(s, "run.max_preemptions", "must be -1 (any), 0 or more.", "set it to -1 or 0 or more.")
    if r.fail_at_epoch is not None and not 1 <= r.fail_at_epoch < t.epochs:
        raise ConfigError(
            s,
            "run.fail_at_epoch",
            f"{r.fail_at_epoch} is outside 1..epochs-1 ({t.epochs - 1}).",
            "pick an epoch after which training still has epochs left, or null.",
        )
    if r.fail_at_batch is not None and (r.fail_at_epoch is None or r.fail_at_batch < 1):
        raise ConfigError(
            s,
            "run.fail_at_batch",
            f"is {r.fail_at_batch}: it fails a worker after that many batches of the epoch after run.fail_at_epoch.",
            "set it to 1 or more together with run.fail_at_epoch, or null.",
        )
    if r.profile_steps < 0:
        raise ConfigError(s, "run.profile_steps", "must be >= 0.", "set it to 0 (off) or a number of steps, e.g. 20.")
    if not RUN_NAME.fullmatch(r.name):  # `..` or `a/b` would put the run outside run.storage_path
        raise ConfigError(
            s,
            "run.name",
            f"{r.name!r} is not a plain name (it names a folder under run.storage_path).",
            "use letters, digits, '.', '-' or '_', starting with a letter or digit.",
        )


def _check_extra(cfg: ExperimentConfig) -> None:
    """train.extra: Ultralytics' own arguments, neither yolo_ray's nor unknown to Ultralytics."""
    s, t = cfg.source, cfg.train
    known = ultralytics_train_keys()
    for key in t.extra:
        if key in TRAIN_KEYS:  # train.extra.epochs would beat train.epochs behind its back
            raise ConfigError(
                s, f"train.extra.{key}", f"is train.{key}, set twice.", f"set train.{key} and remove train.extra.{key}."
            )
        if key in MANAGED_KEYS:
            raise ConfigError(
                s,
                f"train.extra.{key}",
                "is set by yolo_ray itself.",
                "remove it (batch and accumulate live in train.*; device comes from scaling.*).",
            )
        if known and key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigError(
                s,
                f"train.extra.{key}",
                "is not an Ultralytics train argument.",
                f"remove it{f' or use `{close[0]}`' if close else ''}.",
            )


def _check_data(cfg: ExperimentConfig) -> None:
    s = cfg.source
    if not 0 <= cfg.data.max_bad_fraction <= 1:
        raise ConfigError(
            s, "data.max_bad_fraction", "must be a share between 0 and 1.", "set e.g. 0.01 (1% of a split's images)."
        )
    if cfg.data.path == "synthetic":
        syn = cfg.data.synthetic
        if syn.imgsz < 32 or not 1 <= syn.classes <= 8 or syn.images < 2:
            raise ConfigError(
                s,
                "data.synthetic",
                "needs imgsz >= 32, 1..8 classes and at least 2 images.",
                "fix data.synthetic.images / imgsz / classes.",
            )


# Ultralytics train arguments the device loader does not implement: refused rather than silently dropped.
DEVICE_LOADER_UNSUPPORTED = {
    "perspective": "is an augmentation",
    "mixup": "is an augmentation",
    "cutmix": "is an augmentation",
    "copy_paste": "is an augmentation",
    "rect": "changes image shapes per batch, which",
    "multi_scale": "changes image shapes per batch, which",
}


def check_gpu_only(cfg: ExperimentConfig, use_gpu: bool, cpu_reason: str) -> None:
    """Refuse GPU-only keys on a CPU run: from the config (use_gpu: false) and again once Ray resolves `auto`."""
    if use_gpu:
        return
    gpu_only = {
        "train.sync_bn": (cfg.train.sync_bn, "SyncBatchNorm runs on NCCL"),
        "train.cuda_graphs": (cfg.train.cuda_graphs, "graphs replay CUDA work"),
    }
    for key, (wanted, why) in gpu_only.items():
        if wanted:
            raise ConfigError(
                cfg.source, key, f"needs GPUs ({why}), and {cpu_reason}.", f"set {key}: false, or train on GPUs."
            )


def check_cuda_graphs(cfg: ExperimentConfig) -> None:
    """CUDA graphs cannot hold SyncBatchNorm's collectives, sit under torch.compile, or see freezing after capture."""
    t = cfg.train
    if not t.cuda_graphs:
        return
    for bad, problem, fix in (
        (t.sync_bn, "cannot capture SyncBatchNorm's collectives.", "set train.sync_bn or train.cuda_graphs false."),
        ("compile" in t.extra, "and train.extra.compile both wrap the model.", "drop one of them."),
        ("freeze" in t.extra, "are captured before Ultralytics freezes train.extra.freeze.", "drop one of them."),
    ):
        if bad:
            raise ConfigError(cfg.source, "train.cuda_graphs", problem, fix)


# what needs every train label up front, which the stream reads only as it serves them
STREAM_UNSUPPORTED = {"cls_pw": "weighs classes by counting every train label up front, which"}


def check_device_loader(cfg: ExperimentConfig) -> None:
    """The device loader's (and the stream loader's, which augments with it) settings."""
    d = cfg.data
    if d.loader != "stream":
        for key, value, default in (
            ("stream_decode", d.stream_decode, "auto"),
            ("stream_buffer", d.stream_buffer, 0),
            ("s3_endpoint", d.s3_endpoint, ""),
        ):
            if value != default:
                raise ConfigError(
                    cfg.source,
                    f"data.{key}",
                    f"is {value!r}, but data.loader is {d.loader}: only the stream loader reads it.",
                    f"set data.loader: stream, or remove data.{key}.",
                )
    if d.stream_buffer < 0:
        raise ConfigError(cfg.source, "data.stream_buffer", "must be >= 0.", "set 0 (Ultralytics' rule) or a count.")
    if d.loader not in ("device", "stream"):
        if cfg.data.device_cache != "auto":
            raise ConfigError(
                cfg.source,
                "data.device_cache",
                f"is {cfg.data.device_cache}, but data.loader is {cfg.data.loader}: only the device loader caches.",
                "set data.loader: device, or remove data.device_cache.",
            )
        return
    if d.loader == "stream" and d.device_cache != "auto":
        raise ConfigError(
            cfg.source,
            "data.device_cache",
            f"is {d.device_cache}: the stream loader caches nothing (a ring of recent images for mosaic).",
            "remove data.device_cache (or use data.loader: device).",
        )
    unsupported = {**DEVICE_LOADER_UNSUPPORTED, **(STREAM_UNSUPPORTED if d.loader == "stream" else {})}
    for key, what in unsupported.items():
        if cfg.train.extra.get(key):
            raise ConfigError(
                cfg.source,
                f"train.extra.{key}",
                f"is {cfg.train.extra[key]}: it {what} data.loader={d.loader} does not implement.",
                f"remove train.extra.{key} (or set it to 0), or set data.loader: ultralytics.",
            )


def check_worker_range(cfg: ExperimentConfig, key: str, workers: list) -> None:
    """An elastic [min, max]: two whole numbers, 1 <= min <= max, and at least one image per worker at max."""
    ok = len(workers) == 2 and all(isinstance(w, int) and not isinstance(w, bool) for w in workers)
    if not ok or not 1 <= workers[0] <= workers[1]:
        raise ConfigError(
            cfg.source,
            key,
            f"{workers!r} is not a worker range.",
            f"write [min, max] with 1 <= min <= max, e.g. {key}=[1,4] (or one number for a fixed group).",
        )
    if cfg.train.accumulate is None:
        raise ConfigError(
            cfg.source,
            "train.accumulate",
            f"is null (Ultralytics' rule, round(64 / batch)), but {key} is elastic: its images per optimizer step "
            "are kept at every size, so they must be stated.",
            "set train.accumulate to a number, e.g. 1.",
        )
    if cfg.train.batch < workers[1]:
        raise ConfigError(
            cfg.source,
            "train.batch",
            f"global batch {cfg.train.batch} is smaller than {key} max {workers[1]}: a worker would get no image.",
            f"set train.batch to {workers[1]} or more.",
        )


def worker_range(num_workers: int | list) -> tuple[int, int]:
    """(min, max) workers of a fixed or elastic setting (not `auto`)."""
    return (num_workers[0], num_workers[1]) if isinstance(num_workers, list) else (num_workers, num_workers)


def check_batch_divides(cfg: ExperimentConfig, num_workers: int) -> None:
    b = cfg.train.batch
    if b % num_workers:
        lo, hi = b // num_workers * num_workers, (b // num_workers + 1) * num_workers
        raise ConfigError(
            cfg.source,
            "train.batch",
            f"global batch {b} does not divide by scaling.num_workers={num_workers} "
            "(each Ray worker takes batch / num_workers images).",
            f"set train.batch to a multiple of {num_workers}, e.g. {lo or hi} or {hi}.",
        )

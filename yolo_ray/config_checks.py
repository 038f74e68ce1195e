"""The config's checks that need neither the dataset nor the cluster (check_static, run on every load), and the ones
the driver runs once it knows the cluster (worker counts, the batch split, GPU-only features). Each raises a
ConfigError naming the file, the key and the fix, before Ray or a GPU is touched.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import re
from pathlib import Path

import yaml

from yolo_ray import user_callbacks
from yolo_ray.config_schema import ConfigError, ExperimentConfig, TrainSection

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
TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainSection)} - {"extra", "callbacks"}

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
    user_callbacks.parse(cfg.train.callbacks, cfg.source)
    check_gpu_only(cfg, cfg.scaling.use_gpu is not False, "scaling.use_gpu is false")
    check_val_async(cfg)
    check_cuda_graphs(cfg)
    check_device_loader(cfg)
    _check_extra(cfg)
    _check_data(cfg)


def _check_train(cfg: ExperimentConfig) -> None:
    s, t = cfg.source, cfg.train
    if not t.grad_clip >= 0:  # NaN too
        raise ConfigError(
            s, "train.grad_clip", f"must be a norm >= 0, got {t.grad_clip}.", "set e.g. 10.0 (Ultralytics'), or 0."
        )
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
        "train.val_cuda_graphs": (cfg.train.val_cuda_graphs, "graphs replay CUDA work"),
    }
    for key, (wanted, why) in gpu_only.items():
        if wanted:
            raise ConfigError(
                cfg.source, key, f"needs GPUs ({why}), and {cpu_reason}.", f"set {key}: false, or train on GPUs."
            )


def check_cuda_graphs(cfg: ExperimentConfig) -> None:
    """CUDA graphs cannot hold SyncBatchNorm's collectives, sit under torch.compile, or see freezing after capture;
    validation's graphs need validation on a GPU."""
    t = cfg.train
    if t.val_cuda_graphs and t.val_async and t.val_runner == "actor" and t.val_gpus <= 0:
        problem = "graphs validation's forward on a GPU, and the validation actor has none (train.val_gpus is 0)."
        fix = "set train.val_gpus (e.g. 0.25), train.val_runner: thread, or train.val_cuda_graphs: false."
        raise ConfigError(cfg.source, "train.val_cuda_graphs", problem, fix)
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

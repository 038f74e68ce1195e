"""A sweep's search space, checked before any trial runs (keys that exist and may be swept, kinds and values, the
scheduler's metric), turned into Ray Tune's, and a sampled point turned into one trial's experiment config."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from yolo_ray import config as config_mod
from yolo_ray.config import ConfigError, ExperimentConfig, TuneSection
from yolo_ray.config_checks import ultralytics_train_keys, worker_range
from yolo_ray.metrics import sweepable
from yolo_ray.tasks import SCORES, metric_key

KINDS = ("choice", "uniform", "loguniform", "grid")


# --------------------------------------------------------------------------------------------- the search space


def _key_exists(cfg: ExperimentConfig, dotted: str) -> bool:
    node: Any = cfg.to_dict()
    parts = dotted.split(".")
    if parts[:2] == ["train", "extra"] and len(parts) == 3:
        return parts[2] in ultralytics_train_keys()
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return not isinstance(node, dict)


def check_space(cfg: ExperimentConfig) -> None:
    """Every bad search space fails here, before Ray or any trial starts."""
    _check_tune_settings(cfg)
    for key, spec in cfg.tune.space.items():
        _check_dimension(cfg, key, spec)


def _check_tune_settings(cfg: ExperimentConfig) -> None:
    t, src = cfg.tune, cfg.source
    if not t.space:
        raise ConfigError(
            src,
            "tune.space",
            "is empty: nothing to sweep.",
            "add e.g. `train.lr0: {loguniform: [0.0001, 0.1]}` under tune.space.",
        )
    if t.num_samples < 1:
        raise ConfigError(src, "tune.num_samples", "must be >= 1.", "set tune.num_samples to 1 or more.")
    if not sweepable(t.metric):  # found only after the first trial trained, otherwise
        what = f"{t.metric!r} is not a metric every epoch reports."
        names = ", ".join(SCORES)
        raise ConfigError(src, "tune.metric", what, f"use a score ({names}), fitness, or a loss (train/box_loss).")
    t.metric = metric_key(t.metric)  # Ultralytics' `metrics/mAP50-95(M)` is history's `mask_mAP50-95`
    if t.scheduler == "asha" and t.reduction_factor < 2:
        raise ConfigError(
            src, "tune.reduction_factor", f"must be >= 2, got {t.reduction_factor}.", "ASHA keeps 1/factor: set 2 or 3."
        )
    if t.scheduler == "asha" and not 1 <= t.grace_period <= cfg.train.epochs:
        raise ConfigError(
            src,
            "tune.grace_period",
            f"{t.grace_period} is outside 1..train.epochs ({cfg.train.epochs}).",
            "set the epochs every trial runs before ASHA may stop it, e.g. 2.",
        )
    for key, value in (("tune.max_concurrent", t.max_concurrent), ("tune.reference_batch", t.reference_batch)):
        if value != "auto" and value < 1:
            raise ConfigError(src, key, f"must be >= 1, got {value}.", "set it to 1 or more.")
    if t.time_budget_s is not None and not t.time_budget_s > 0:
        raise ConfigError(src, "tune.time_budget_s", "must be > 0 seconds.", "set a positive budget, or null.")
    least, most = worker_range(t.trial.num_workers)  # a range is checked with the config
    if least < 1:
        raise ConfigError(src, "tune.trial.num_workers", "must be >= 1.", "set it to 1 or more.")
    if most > 1 and 0 < t.trial.gpus_per_worker < 1:
        raise ConfigError(
            src,
            "tune.trial.gpus_per_worker",
            "a fraction with several workers per trial puts two ranks on one GPU, which NCCL refuses.",
            "use whole GPUs, or tune.trial.num_workers: 1.",
        )
    if cfg.train.val_async:  # its actor would wait outside the trials' reserved resources, and training with it
        raise ConfigError(
            src,
            "train.val_async",
            "is not supported in sweeps: each trial's validation actor would need resources Tune has not reserved.",
            "set train.val_async: false for the sweep (trials validate inline).",
        )


def _check_dimension(cfg: ExperimentConfig, key: str, spec: Any) -> None:
    """One key of tune.space: a training key, a distribution of its kind, and every value it can take valid."""
    t, src = cfg.tune, cfg.source
    least, most = worker_range(t.trial.num_workers)
    where = f"tune.space.{key}"
    if not _key_exists(cfg, key) or key.startswith(("tune.", "run.", "tracking.", "scaling.")):
        raise ConfigError(
            src,
            where,
            f"`{key}` is not a training key that can be swept.",
            "use a dotted key such as train.lr0, train.batch, train.accumulate, train.extra.mosaic.",
        )
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise ConfigError(
            src,
            where,
            f"{spec!r} is not a distribution.",
            f"write one of {', '.join(f'{{{k}: ...}}' for k in KINDS)}.",
        )
    kind, values = next(iter(spec.items()))
    if kind in ("choice", "grid"):
        if not isinstance(values, list) or not values:
            raise ConfigError(src, where, f"{kind} needs a non-empty list of values.", f"e.g. {{{kind}: [8, 16]}}.")
        if kind == "grid" and t.search == "optuna":
            raise ConfigError(
                src,
                where,
                "grid values need the grid (or random) search.",
                "set tune.search: grid, or use {choice: [...]} with Optuna.",
            )
    else:
        if not (isinstance(values, list) and len(values) == 2 and all(isinstance(v, (int, float)) for v in values)):
            raise ConfigError(src, where, f"{kind} needs [low, high].", f"e.g. {{{kind}: [0.001, 0.1]}}.")
        low, high = values
        if low >= high:
            raise ConfigError(src, where, f"low {low} >= high {high}.", "give low < high.")
        if kind == "loguniform" and low <= 0:
            raise ConfigError(src, where, "loguniform needs low > 0.", "use a positive low bound.")
    for value in _candidates(kind, values):  # each sampled config must itself be valid
        sampled = config_mod.apply(cfg, {key: value})
        if key == "train.batch" and least == most and sampled.train.batch % most:  # elastic: batch_plan's rule
            raise ConfigError(
                src,
                where,
                f"batch {value} does not divide by tune.trial.num_workers={t.trial.num_workers}.",
                f"use batches that are multiples of {t.trial.num_workers}.",
            )


def _candidates(kind: str, values: list) -> list:
    return list(values) if kind in ("choice", "grid") else [values[0], values[1]]


def to_tune_space(space: dict[str, dict]) -> dict[str, Any]:
    from ray import tune

    make = {
        "choice": tune.choice,
        "grid": tune.grid_search,
        "uniform": lambda v: tune.uniform(*v),
        "loguniform": lambda v: tune.loguniform(*v),
    }
    return {key: make[kind](values) for key, spec in space.items() for kind, values in spec.items()}


def scaled_lr(t: TuneSection, lr0: float, batch: int, accumulate: int | None) -> float:
    """lr0 for an effective batch of batch * accumulate, scaled from reference_batch (none / linear / sqrt)."""
    ratio = batch * (accumulate or 1) / t.reference_batch
    return lr0 * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[t.lr_scaling]


def trial_config(base: ExperimentConfig, sampled: dict[str, Any], trial_id: str, sweep_dir: Path) -> ExperimentConfig:
    cfg = config_mod.apply(base, sampled)
    lr0 = scaled_lr(base.tune, cfg.train.lr0, cfg.train.batch, cfg.train.accumulate)
    tr = base.tune.trial
    return config_mod.apply(
        cfg,
        {
            "train.lr0": lr0,
            "scaling.num_workers": tr.num_workers,
            "scaling.cpus_per_worker": tr.cpus_per_worker,
            "scaling.gpus_per_worker": tr.gpus_per_worker,
            "run.name": trial_id,
            "run.storage_path": str(sweep_dir / "trials"),
            "tracking.enabled": False,  # the sweep driver logs every trial to MLflow (one writer)
            "tracking.register": False,
        },
    )

"""What a run trains on, checked and resolved on the driver before Ray starts: the model, the dataset, Ultralytics'
own arguments and the run's storage. The launcher and the native baseline both train exactly these inputs.

Everything here fails with ConfigError (exit 2, the file, the key and the fix) and needs no cluster and no GPU.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolo_ray import run_layout as layout
from yolo_ray import tasks
from yolo_ray.config import ConfigError, ExperimentConfig
from yolo_ray.config_checks import TRAIN_KEYS
from yolo_ray.data import checks
from yolo_ray.tasks import TASKS


@dataclass(frozen=True)
class Inputs:
    model: str  # a local file (absolute) or an architecture yaml Ultralytics ships
    task: str  # the model's (tasks.py): which Ultralytics trainer, which labels, which headline metric
    dataset: checks.Dataset


def prepare(cfg: ExperimentConfig) -> Inputs:
    """Every input check that needs no cluster; the run's storage is made and tried for writing."""
    from yolo_ray import ultralytics_env

    ultralytics_env.setup(verbose=cfg.run.verbose)  # before the driver's first import of Ultralytics
    check_local_gpus(cfg)
    model, task = resolve_model(cfg)
    check_task_paths(cfg, task)
    dataset = checks.prepare(cfg, task)
    check_ultralytics_args(cfg, model, dataset.source, task)
    check_storage(cfg)
    return Inputs(model, task, dataset)


# --------------------------------------------------------------------------------------------------- the model


def resolve_model(cfg: ExperimentConfig) -> tuple[str, str]:
    """A model Ultralytics can build offline (a local .pt/.yaml file, or a YOLO architecture yaml it ships) and its
    task."""
    model, local = cfg.model, Path(cfg.model).expanduser()
    if local.is_dir():
        raise ConfigError(cfg.source, "model", f"{model} is a directory.", "give the .pt or .yaml file in it.")
    if local.is_file():
        path = str(local.resolve())
        return path, _check_task(cfg, _checkpoint_task(cfg, local) if local.suffix == ".pt" else _yaml_task(cfg, local))
    if model.endswith(".pt"):
        raise ConfigError(
            cfg.source,
            "model",
            f"weights file {model} does not exist (nothing is downloaded).",
            "give a local .pt path, or an architecture such as yolo11n.yaml to train from scratch.",
        )
    if model.endswith((".yaml", ".yml")) and _shipped_model_yaml(model):
        from ultralytics.nn.tasks import guess_model_task

        return model, _check_task(cfg, guess_model_task(model))
    raise ConfigError(
        cfg.source,
        "model",
        f"{model!r} is neither a local file nor an Ultralytics model yaml.",
        "use e.g. yolo11n.yaml / yolo11s.yaml, or a path to a local .pt or .yaml.",
    )


def _shipped_model_yaml(name: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations))) / "cfg" / "models"
    unscaled = re.sub(r"(\d+)([nslmx])(.*)\.ya?ml$", r"\1\3.yaml", name)  # yolo11n.yaml -> yolo11.yaml
    return any(root.rglob(name)) or any(root.rglob(unscaled))


def _checkpoint_task(cfg: ExperimentConfig, path: Path) -> str:
    """The task of an Ultralytics checkpoint, read on the driver (a worker would fail on it after Ray started)."""
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # pickle, zip and torch errors alike: the file is not a checkpoint this can read
        raise ConfigError(
            cfg.source,
            "model",
            f"{path} is not a readable PyTorch checkpoint ({type(e).__name__}: {' '.join(str(e).split())[:200]}).",
            "give an Ultralytics .pt (e.g. a run's train/weights/best.pt) or an architecture yaml.",
        ) from None
    model = (ckpt.get("ema") or ckpt.get("model")) if isinstance(ckpt, dict) else None
    if model is None:
        raise ConfigError(
            cfg.source,
            "model",
            f"{path} holds no Ultralytics model (no `model` or `ema` entry).",
            "give a .pt saved by Ultralytics or yolo_ray training, or an architecture yaml.",
        )
    return getattr(model, "task", None) or (ckpt.get("train_args") or {}).get("task") or "detect"


def _yaml_task(cfg: ExperimentConfig, path: Path) -> str:
    from ultralytics.nn.tasks import guess_model_task, yaml_model_load

    try:
        return guess_model_task(yaml_model_load(path))
    except Exception as e:
        raise ConfigError(
            cfg.source, "model", f"{path} is not a model yaml Ultralytics can read ({e}).", "fix or replace it."
        ) from None


def _check_task(cfg: ExperimentConfig, task: str) -> str:
    """The model's task, which `task:` (when set) must agree with."""
    if task not in TASKS:
        raise ConfigError(
            cfg.source,
            "model",
            f"{cfg.model} is a {task} model; yolo_ray trains {', '.join(TASKS)} models.",
            "use e.g. yolo11n.yaml, yolo11n-seg.yaml, yolo11n-pose.yaml, yolo11n-obb.yaml or yolo11n-cls.yaml.",
        )
    if cfg.task not in ("auto", task):
        wanted = f"yolo11n{tasks.get(cfg.task).model_suffix}.yaml"
        raise ConfigError(
            cfg.source,
            "task",
            f"is {cfg.task}, but the model {cfg.model} is a {task} model.",
            f"use a {cfg.task} model (e.g. model={wanted}), or task={task} (or leave task: auto).",
        )
    return task


def check_task_paths(cfg: ExperimentConfig, task: str) -> None:
    """The fast path's parts that know only some tasks' labels or heads (tasks.py), refused for the others before
    anything starts."""
    if cfg.data.loader == "device" and not tasks.get(task).device_loader:
        raise ConfigError(
            cfg.source,
            "data.loader",
            f"is `device`, whose augmentation moves boxes and keypoints only; a {task} model needs its labels "
            "moved too.",
            "use data.loader=ultralytics (Ultralytics' own loader, which augments every task's labels).",
        )
    if cfg.data.loader == "stream" and task != "detect":
        raise ConfigError(
            cfg.source,
            "data.loader",
            f"is `stream`, which reads detection labels (boxes) only; a {task} model needs its own labels.",
            "use data.loader=device (detect, pose) or ultralytics (every task) for this model.",
        )
    for key, on in (("train.cuda_graphs", cfg.train.cuda_graphs), ("train.val_cuda_graphs", cfg.train.val_cuda_graphs)):
        if on and not tasks.get(task).cuda_graphs:
            raise ConfigError(
                cfg.source,
                key,
                f"is measured and tested for detection only, not for a {task} model's heads.",
                f"set {key}=false (train.channels_last and AMP still apply).",
            )


# --------------------------------------------------------------------------------------------------- Ultralytics


def ultralytics_overrides(
    cfg: ExperimentConfig, model: str, data_yaml: Path, save_dir: Path, task: str = "detect"
) -> dict[str, Any]:
    """The Ultralytics train arguments for this experiment (batch is global; accumulate maps to nbs)."""
    t = cfg.train
    overrides = {
        "model": model,
        "task": task,
        "data": str(data_yaml),
        "epochs": t.epochs,
        "imgsz": t.imgsz,
        "batch": t.batch,
        "lr0": t.lr0,
        "lrf": t.lrf,
        "optimizer": t.optimizer,
        "momentum": t.momentum,
        "weight_decay": t.weight_decay,
        "warmup_epochs": t.warmup_epochs,
        "cos_lr": t.cos_lr,
        "amp": t.amp,
        "cache": t.cache,
        "workers": t.workers,
        "seed": t.seed,
        "deterministic": t.deterministic,
        "close_mosaic": t.close_mosaic,
        "patience": t.patience,
        "val": t.val,
        "plots": t.plots,
        "save_dir": str(save_dir),
        "exist_ok": True,
        "pretrained": False,
        **t.extra,
    }
    if t.accumulate is not None:  # Ultralytics steps every round(nbs / batch) batches; weight decay scales with it
        overrides["nbs"] = t.batch * t.accumulate  # (a worker sets batch and nbs for its group's size: batch_plan)
    return overrides


def check_ultralytics_args(cfg: ExperimentConfig, model: str, data_yaml: Path, task: str = "detect") -> None:
    """Ultralytics' own checks of every train argument (types and ranges: lr0 and momentum in 0..1, fliplr a
    probability, no NaN), run on the driver: in a worker they fail after Ray started, in every rank."""
    from ultralytics.cfg import get_cfg

    with tempfile.TemporaryDirectory() as tmp:
        overrides = ultralytics_overrides(cfg, model, data_yaml, Path(tmp), task)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its CLI help on a bad key
                get_cfg(overrides=overrides)
        except (TypeError, ValueError, SyntaxError) as e:
            problem = " ".join(str(e).split())
            fix = "set a value of the type and range it names."
            raise ConfigError(cfg.source, _our_key(cfg, problem), problem, fix) from None


def _our_key(cfg: ExperimentConfig, problem: str) -> str:
    """The config key behind an Ultralytics argument named in its message (`'fliplr=5.0' is an invalid value`)."""
    m = re.search(r"'(\w+)=", problem) or re.search(r"'(\w+)'", problem)
    name = m.group(1) if m else ""
    if name in cfg.train.extra:
        return f"train.extra.{name}"
    return f"train.{name}" if name in TRAIN_KEYS else "train"


def check_local_gpus(cfg: ExperimentConfig) -> None:
    """A private local Ray (no ray_address, no RAY_ADDRESS) has this machine's GPUs: asked for GPUs where there are
    none, say so before Ray starts (a cluster's GPUs are counted once connected: ray_cluster.resolve)."""
    import os

    if cfg.scaling.use_gpu is not True or cfg.run.ray_address or os.environ.get("RAY_ADDRESS"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            cfg.source,
            "scaling.use_gpu",
            "is true, but this machine has no GPU for the local Ray a run starts here.",
            "train on CPUs (scaling.use_gpu: false, or device=cpu), or give run.ray_address of a cluster with GPUs.",
        )


# --------------------------------------------------------------------------------------------------- storage


def check_storage(cfg: ExperimentConfig) -> Path:
    """run.storage_path exists (made if need be), is a directory, and takes a file; returns the run directory."""
    storage = Path(cfg.run.storage_path).expanduser()
    if storage.exists() and not storage.is_dir():
        raise ConfigError(
            cfg.source, "run.storage_path", f"{storage} is a file, not a directory.", "point it at a directory."
        )
    try:
        storage.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=storage, prefix=".yolo_ray-write-check-"):
            pass
    except OSError as e:
        raise ConfigError(
            cfg.source,
            "run.storage_path",
            f"{storage} cannot be written ({e.strerror or e}).",
            "point it at a directory you can write (shared storage on a cluster), or fix its permissions.",
        ) from None
    return layout.run_dir(storage, cfg.run.name)

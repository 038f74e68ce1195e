"""What an MLflow run records of a yolo_ray run: params (the config, less what only drove it), tags (versions,
commit, who ran it), history.jsonl rows as grouped metric names, and the dataset as MLflow dataset inputs."""

from __future__ import annotations

import json
from typing import Any

from yolo_ray import gitinfo
from yolo_ray.config import ExperimentConfig
from yolo_ray.tasks import SCORES


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _versions() -> dict[str, str]:
    import mlflow
    import ray
    import torch

    import yolo_ray

    try:
        from importlib.metadata import version

        ultralytics_version = version("ultralytics")
    except Exception:
        ultralytics_version = "unknown"
    return {
        "yolo_ray": yolo_ray.__version__,
        "ultralytics": ultralytics_version,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "mlflow": mlflow.__version__,
        "cuda": str(torch.version.cuda),
    }


def log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items()) if not k.startswith("tracking.tags")]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


def run_tags(cfg: ExperimentConfig) -> dict[str, str]:
    """Versions, git commit and config source: the tags every yolo_ray run carries."""
    tags = {f"version.{k}": v for k, v in _versions().items()}
    commit = gitinfo.commit()  # the working directory: the user's project
    if commit:
        tags["mlflow.source.git.commit"] = commit
    tags["config"] = cfg.source
    tags.update({str(k): str(v) for k, v in cfg.tracking.tags.items()})
    return tags


# Keys that describe how a run was driven, not what it trained: left out of its MLflow params.
NOT_PARAMS = (
    "run.fail_at_epoch", "run.fail_rank", "run.fail_at_batch", "run.fail_val_at_epoch", "run.ray_address",
    "run.verbose", "tracking.tags", "tracking.outage_grace_s",
)  # fmt: skip


def run_params(cfg: ExperimentConfig, sweep_trial: bool) -> dict[str, Any]:
    """The config as MLflow params: what describes the run (tune.* only in a sweep's trials)."""
    params = flatten(cfg.to_dict())
    return {
        k: v for k, v in params.items() if not k.startswith(NOT_PARAMS) and (sweep_trial or not k.startswith("tune."))
    }


def context_tags(cfg: ExperimentConfig) -> dict[str, str]:
    """MLflow's own context tags, shown on the run page: who ran it and from what."""
    import getpass
    import sys

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return {
        "mlflow.user": user,
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": " ".join(["yolo-ray", *sys.argv[1:2], cfg.source])[:500],
    }


def describe(cfg: ExperimentConfig, workers: int | None) -> str:
    data = cfg.data.path if cfg.data.path != "synthetic" else f"generated {cfg.data.synthetic.style} ({cfg.data.dir})"
    who = f"{workers} workers x {cfg.train.batch // workers} images" if workers else f"global batch {cfg.train.batch}"
    return f"{cfg.model} on {data}, {who}, {cfg.train.epochs} epochs at {cfg.train.imgsz} px."


# history.jsonl's keys as the MLflow run shows them, grouped as Ultralytics' results.csv groups them (metrics/,
# train/, val/, lr/) with timings under time/ and gradient norms under optim/; MLflow sorts keys, so a group reads
# together in the UI.
METRIC_NAMES = {
    **{k: f"metrics/{k}" for k in SCORES},  # every task's: mAP50-95, mask_mAP50-95, pose_mAP50-95, top1, ...
    "epoch_time_s": "time/epoch_s",  # Ultralytics' epoch_time: training and the end of the epoch
    "train_time_s": "time/train_s",  # the batch loop
    "val_s": "time/val_s",
    "save_s": "time/epoch_end_s",  # Ultralytics' end of epoch: validation, results.csv, the checkpoint snapshot
    "report_s": "time/report_s",
    "persist_s": "time/persist_s",
    "checkpoint_write_s": "time/checkpoint_write_s",
    "images_per_s": "speed/images_per_s",
    "gpu_mem_peak_gib": "system/gpu_mem_peak_gib",
    "data_device_peak_gib": "system/data_device_peak_gib",  # the device/stream loader's data on the device
    # the optimizer steps' gradient norms before clipping (worker/grad_norms.py)
    **{k: f"optim/{k}" for k in ("grad_norm_mean", "grad_norm_max", "grad_clipped_share", "grad_norm_steps")},
}
# Not metrics: the step itself, Ultralytics' fitness (its mAP50-95 for detection)
NOT_METRICS = ("epoch", "fitness", "time")
# The group's size and its split of the batch: params of a fixed group, metrics of an elastic one (it resizes)
GROUP = ("world_size", "per_worker_batch", "images_per_step")


def mlflow_metrics(row: dict[str, Any], elastic: bool = False) -> dict[str, float]:
    """One history.jsonl row as MLflow metrics: grouped names, and nothing that only restates the run (a first
    attempt's resumed_from_epoch -1, a CPU run's GPU memory 0, a fixed group's size)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key in NOT_METRICS:
            continue
        if key in GROUP:
            if elastic:
                out[f"system/{key}"] = float(value)
            continue
        if (key == "resumed_from_epoch" and value < 0) or (key == "gpu_mem_peak_gib" and not value):
            continue
        if key.startswith("val_ms_per_image/"):
            key = "time/" + key
        out[METRIC_NAMES.get(key, key)] = float(value)
    return out


def dataset_inputs(dataset: Any) -> list[Any]:
    """The run's dataset as MLflow dataset inputs, one per split (the run page's Datasets column): name, Ultralytics'
    hash of the split's files as digest, where it is, and what the checks counted as its profile."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    out = []
    for split, context in (("train", "training"), ("val", "validation")):
        s = dataset.splits[split]
        profile = {
            "images": len(s.images),
            "labelled_images": s.labelled,
            "boxes": s.boxes,
            "unusable_images": len(s.unusable),
            "classes": len(dataset.names),
        }
        entity = Dataset(
            name=dataset.name,
            digest=dataset.digest(split)[:16],
            source_type="local",
            source=json.dumps({"data_yaml": str(dataset.source), "split": split}),
            profile=json.dumps(profile),
        )
        out.append(DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return out

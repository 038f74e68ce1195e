"""The five YOLO11 tasks: what each trains with, how its labels look, and which metric is its headline.

One table, read by the driver (which task a model is, whether the dataset fits it, what to report) and by the worker
(which Ultralytics trainer to adapt). Nothing here imports Ultralytics at module level: the driver reads it before
Ray starts.
"""

from __future__ import annotations

from dataclasses import dataclass

TASKS = ("detect", "segment", "pose", "obb", "classify")


@dataclass(frozen=True)
class Task:
    name: str
    trainer: str  # Ultralytics' trainer class, under ultralytics.models.yolo.<name>
    headline: str  # the history.jsonl key a run is judged and registered by
    labels: str  # what one label row holds, for error messages
    model_suffix: str  # Ultralytics' model yaml suffix: yolo11n{suffix}.yaml
    device_loader: bool = False  # data.loader=device moves its labels (boxes; keypoints)
    cuda_graphs: bool = False  # train.cuda_graphs is measured and tested on its head


TABLE = {
    "detect": Task("detect", "DetectionTrainer", "mAP50-95", "class x y w h (a box)", "", True, True),
    "segment": Task("segment", "SegmentationTrainer", "mask_mAP50-95", "class x1 y1 x2 y2 ... (a polygon)", "-seg"),
    "pose": Task("pose", "PoseTrainer", "pose_mAP50-95", "class x y w h then kpt_shape keypoints", "-pose", True),
    "obb": Task("obb", "OBBTrainer", "mAP50-95", "class x1 y1 x2 y2 x3 y3 x4 y4 (a rotated box)", "-obb"),
    "classify": Task("classify", "ClassificationTrainer", "top1", "a folder per class", "-cls"),
}

# Ultralytics' metric keys -> history.jsonl's (MLflow rejects parentheses): boxes keep the plain names, masks and
# keypoints a prefix; classification's accuracies are top1 / top5
_SUFFIXES = {"B": "", "M": "mask_", "P": "pose_"}
RENAMES = {
    **{
        f"metrics/{name}({suffix})": f"{prefix}{name}"
        for suffix, prefix in _SUFFIXES.items()
        for name in ("precision", "recall", "mAP50", "mAP50-95")
    },
    "metrics/accuracy_top1": "top1",
    "metrics/accuracy_top5": "top5",
}
SCORES = tuple(RENAMES.values())  # every score a task reports (losses and fitness apart)


def get(task: str) -> Task:
    return TABLE[task]


def trainer_base(task: str) -> type:
    """Ultralytics' trainer class for a task (imports Ultralytics: call it in the worker, after Ray set the ranks)."""
    import importlib

    module = importlib.import_module(f"ultralytics.models.yolo.{task}")
    return getattr(module, TABLE[task].trainer)


def metric_key(name: str) -> str:
    """A metric as a user may write it (Ultralytics' `metrics/mAP50-95(M)` or ours, `mask_mAP50-95`) -> ours."""
    return RENAMES.get(name, name)

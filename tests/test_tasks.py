"""Segment, pose, OBB and classify through the same Ray path as detection: 2 CPU workers on each task's generated
data, a worker failure and its resume, the task's own metrics in history.jsonl and MLflow, and its ONNX export
registered and predicting.

One run per task does it all (mechanics and learning share it, to keep CI short): the run fails after epoch
FAILS_AFTER (run.max_failures=1 restarts the group from that checkpoint) and trains on to its last epoch. Pose trains
on the device loader (keypoints moved on the training device; tests/data/test_device_loader.py holds them to
Ultralytics' pipeline), the others on Ultralytics' loader."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient

from tests.conftest import REPO, MlflowServer, SharedRay, read_jsonl, yolo_ray
from yolo_ray.data.synth import SynthSpec, dataset_path, generate
from yolo_ray.tracking.export import letterbox_batch

FAILS_AFTER, IMGSZ = 3, 96
# task: (model, epochs, the metric watched, the least its last epoch must reach). An untrained model scores exactly 0
# on every mAP here and ~1/3 top-1 on 3 balanced classes. The detection-style sets have one class and up to 3 objects
# an image: 8 epochs of 12 steps on 2 CPUs then learn visibly (native Ultralytics on the OBB set: mAP50 0 for 5
# epochs, 0.17 / 0.27 / 0.30 at epochs 6-8).
TASKS = {
    "segment": ("yolo11n-seg.yaml", 8, "mask_mAP50", 0.01),  # CI 2026-12-05: 0 to epoch 6, 0.0001, 0.0172
    "pose": ("yolo11n-pose.yaml", 8, "pose_mAP50", 0.02),
    "obb": ("yolo11n-obb.yaml", 8, "mAP50", 0.05),
    "classify": ("yolo11n-cls.yaml", 10, "top1", 0.45),
}
LOADER = {"pose": "device"}
EXTRA = {"classify": ("train.optimizer=AdamW", "train.lr0=0.001")}


@pytest.fixture(scope="module", params=sorted(TASKS))
def task_run(
    request: pytest.FixtureRequest, mlflow_server: MlflowServer, shared_ray: SharedRay, tmp_path_factory
) -> tuple[str, Path]:
    task = request.param
    root = tmp_path_factory.mktemp(task)
    # classify: 384 images (76 to validate: top-1 on 38 moved by 0.08 between runs of the same settings)
    kind = {"classes": 3, "images": 384} if task == "classify" else {"classes": 1, "max_objects": 3, "images": 192}
    data = dataset_path(generate(root / "data", SynthSpec(imgsz=IMGSZ, seed=4, task=task, **kind)), task)
    proc = yolo_ray(
        "train",
        str(REPO / "experiments" / "smoke.yaml"),
        f"model={TASKS[task][0]}",
        f"data={data}",
        f"imgsz={IMGSZ}",
        f"epochs={TASKS[task][1]}",
        "close_mosaic=2",
        f"data.loader={LOADER.get(task, 'ultralytics')}",
        *EXTRA.get(task, ()),
        "plots=false",
        "run.max_failures=1",
        f"run.fail_at_epoch={FAILS_AFTER}",
        "run.fail_rank=1",
        f"run.storage_path={root}",
        f"run.name={task}",
        "tracking.enabled=true",
        f"tracking.uri={mlflow_server.uri}",
        f"tracking.model_name=tasks-{task}",
        cwd=root,
        env=shared_ray.env(),
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    return task, root / task


def test_task_trains_resumes_and_learns(task_run: tuple[str, Path]) -> None:
    task, run_dir = task_run
    _, epochs, metric, least = TASKS[task]
    history = read_jsonl(run_dir / "history.jsonl")
    assert [h["epoch"] for h in history] == list(range(1, epochs + 1))  # each epoch once, across the restart
    assert {h["resumed_from_epoch"] for h in history[FAILS_AFTER:]} == {FAILS_AFTER}
    assert history[FAILS_AFTER]["start_weights_sha256"] == history[FAILS_AFTER - 1]["saved_weights_sha256"]
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank*.json"))]
    assert len(ranks) == 2 and ranks[0]["param_sha256"] == ranks[1]["param_sha256"]
    assert [r["cached_images"] for r in ranks] == ([192, 192] if LOADER.get(task) == "device" else [None, None])
    curve = [h[metric] for h in history]
    assert curve[-1] >= least and curve[-1] > curve[0], f"{task} {metric} per epoch: {curve}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["task"] == task and summary["status"] == "finished" and summary["final"][metric] >= least
    assert json.loads((run_dir / "export" / "check.json").read_text())["ok"]  # onnxruntime == PyTorch


def test_task_metrics_and_model_in_mlflow(task_run: tuple[str, Path], mlflow_server: MlflowServer) -> None:
    task, run_dir = task_run
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    version = client.get_model_version_by_alias(f"tasks-{task}", "candidate")
    headline = {"segment": "mask_mAP50-95", "pose": "pose_mAP50-95", "obb": "mAP50-95", "classify": "top1"}[task]
    assert version.tags["task"] == task and version.tags["headline"] == headline and headline in version.tags
    run = client.get_run(version.run_id)
    assert f"metrics/{headline}" in run.data.metrics and f"final/{headline}" in run.data.metrics
    steps = client.get_metric_history(version.run_id, f"metrics/{headline}")
    assert sorted(m.step for m in steps) == list(range(1, TASKS[task][1] + 1))

    mlflow.set_tracking_uri(mlflow_server.uri)
    mlflow.set_registry_uri(mlflow_server.uri)
    model = mlflow.pyfunc.load_model(f"models:/tasks-{task}@candidate")
    data = run_dir.parent / "data"
    images = sorted(data.glob("val/*/*.jpg") if task == "classify" else data.glob("val/images/*.jpg"))
    out = model.predict(letterbox_batch(images, IMGSZ))
    pred = np.asarray(next(iter(out.values())) if isinstance(out, dict) else out)
    if task == "classify":  # (images, classes) probabilities: the registered model scores as the run's validation did
        names = sorted(p.name for p in (data / "val").iterdir())
        top1 = np.mean([names[int(p.argmax())] == img.parent.name for p, img in zip(pred, images, strict=True)])
        final = json.loads((run_dir / "summary.json").read_text())["final"]["top1"]
        assert pred.shape == (len(images), 3) and abs(top1 - final) <= 0.1, (top1, final)
    else:  # (images, 4 box values + 1 class + the task's extra channels, anchors): best.pt's own predictions
        extra = {"segment": 32, "pose": 12, "obb": 1}[task]
        assert pred.shape[:2] == (len(images), 4 + 1 + extra)
        import torch
        from ultralytics.nn.tasks import load_checkpoint

        best, _ = load_checkpoint(str(run_dir / "train" / "weights" / "best.pt"))
        with torch.no_grad():
            ref = best.float().eval()(torch.from_numpy(letterbox_batch(images, IMGSZ)))
        while isinstance(ref, (list, tuple)):
            ref = ref[0]
        assert np.abs(pred - ref.numpy()).max() <= 1e-3 * np.abs(ref.numpy()).max()

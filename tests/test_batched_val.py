"""Detection validation batched over images (worker/batched_val.py) gives Ultralytics' validator's results: the
same detections from NMS, the same matches, the same metrics on trained weights."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from yolo_ray import triton_kernels, ultralytics_env
from yolo_ray.run_layout import weights


@pytest.fixture(autouse=True)
def ultralytics() -> Iterator[None]:
    """Ultralytics set up (offline, its own settings dir) for each test, after the session's fixtures started their
    processes, and the environment it writes put back after it: Ray nodes that later tests start must not inherit it
    (YOLO_VERBOSE above all)."""
    saved = dict(os.environ)
    ultralytics_env.setup()
    yield
    os.environ.clear()
    os.environ.update(saved)


IOUV = torch.linspace(0.5, 0.95, 10)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU"))]


def _images(seed: int, n: int = 12) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(iou [G, P], label classes, detection classes) per image: clusters of detections around few labels, so that
    detections compete for labels, some images with no labels or no detections."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        labels, dets = (0 if i == 3 else int(torch.randint(1, 8, (1,), generator=g))), (0 if i == 5 else 40)
        iou = (torch.rand(labels, dets, generator=g) * 1.3 - 0.2).clamp(0, 1)
        iou[torch.rand(labels, dets, generator=g) < 0.5] = 0
        out.append((iou, torch.randint(0, 3, (labels,), generator=g), torch.randint(0, 3, (dets,), generator=g)))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matching_all_images_at_once_is_ultralytics_image_by_image(seed: int, device: str) -> None:
    from ultralytics.models.yolo.detect import DetectionValidator

    from yolo_ray.worker.batched_val import match_greedy

    upstream = DetectionValidator(args={"plots": False})
    images = _images(seed)
    g, p = max(i[0].shape[0] for i in images), max(i[0].shape[1] for i in images)
    padded = torch.zeros(len(images), g, p)
    for k, (iou, label_cls, det_cls) in enumerate(images):
        padded[k, : iou.shape[0], : iou.shape[1]] = iou * (label_cls[:, None] == det_cls)
    correct = match_greedy(padded.to(device), IOUV.to(device)).cpu()
    for k, (iou, label_cls, det_cls) in enumerate(images):
        want = upstream.match_predictions(det_cls, label_cls, iou) if iou.numel() else torch.zeros(iou.shape[1], 10)
        assert torch.equal(correct[k, : iou.shape[1]], want.bool()), k
    assert correct.any()  # the case is not trivial


# one call for the batch; calls of a few images each; each image's top 40 first, then 320, then all (max_det 300
# needs every round: few of 40 boxes clustered on 8 objects survive NMS); the kernel's rounds (one program an image,
# on the CPU in Triton's interpreter: what a GPU runs), then torchvision's once an image has more than it walks
@pytest.mark.parametrize(("nms_boxes", "prefix", "kernel"),
                         [(1 << 15, 2048, False), (700, 2048, False), (700, 40, False), (700, 40, True)])  # fmt: skip
@pytest.mark.parametrize("device", DEVICES)
def test_nms_over_many_images_at_once_gives_ultralytics_detections_per_image(
    device: str, nms_boxes: int, prefix: int, kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yolo_ray.worker import batched_val

    if kernel and device == "cpu" and not triton_kernels.interpreter_takes_loaded_scalars():
        pytest.skip("Triton's interpreter before 3.7 cannot run the NMS kernel")
    from yolo_ray.worker import nms_kernel

    monkeypatch.setattr(batched_val, "NMS_BOXES", nms_boxes)
    monkeypatch.setattr(batched_val, "NMS_PREFIX", prefix)
    monkeypatch.setattr(batched_val, "KERNEL_DEVICES", ("cpu", "cuda") if kernel else ())
    monkeypatch.setattr(nms_kernel, "MAX_BOXES", 512)  # rounds of 40 and 320 in it, 2560 in torchvision
    walked = []
    monkeypatch.setattr(nms_kernel, "greedy_nms_per_image", _recorded(nms_kernel.greedy_nms_per_image, walked))
    _assert_ultralytics_detections(_clustered_prediction(device))
    # the kernel's rounds ran in it (a failing kernel would fall back to torchvision with the same detections)
    assert bool(walked) == kernel and batched_val.KERNEL_DEVICES == (("cpu", "cuda") if kernel else ())


def test_a_kernel_that_fails_leaves_validation_to_torchvision(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """No Triton, or a GPU it cannot compile for: the validator says so once, and NMS goes on in torchvision's calls
    with Ultralytics' detections; the kernel is not tried again on that device type."""
    from yolo_ray.worker import batched_val, nms_kernel

    tries = []

    def fails(*args: object) -> None:
        tries.append(args)
        raise RuntimeError("no Triton backend for this GPU")

    monkeypatch.setattr(batched_val, "NMS_PREFIX", 40)
    monkeypatch.setattr(batched_val, "KERNEL_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(nms_kernel, "greedy_nms_per_image", fails)
    _assert_ultralytics_detections(_clustered_prediction("cpu"))
    assert len(tries) == 1 and batched_val.KERNEL_DEVICES == ("cuda",)
    out = capsys.readouterr().out
    assert out.count("NMS kernel failed on cpu (RuntimeError: no Triton backend for this GPU)") == 1


def _recorded(fn: Any, calls: list) -> Any:
    def call(*args: Any) -> Any:
        calls.append(args)
        return fn(*args)

    return call


def _clustered_prediction(device: str) -> torch.Tensor:
    """A batch of model output: boxes clustered on a few objects (NMS has work to do), an image with no detection."""
    g = torch.Generator().manual_seed(0)
    bs, nc, anchors = 6, 5, 900
    centres = torch.rand(bs, 2, 8, generator=g) * 120
    xy = centres[:, :, torch.randint(0, 8, (anchors,), generator=g)] + torch.randn(bs, 2, anchors, generator=g) * 4
    wh = 10 + torch.rand(bs, 2, anchors, generator=g) * 30
    scores = torch.rand(bs, nc, anchors, generator=g) ** 4
    scores[1] = 0
    prediction = torch.cat([xy, wh, scores], 1).to(device)
    return prediction.half() if device == "cuda" else prediction  # as a training-mode validation's model gives them


def _assert_ultralytics_detections(prediction: torch.Tensor) -> None:
    """batched_nms gives Ultralytics' non_max_suppression detections, image by image, bit for bit."""
    from ultralytics.utils.nms import non_max_suppression

    from yolo_ray.worker import batched_val

    # upstream's max_nms cuts each image to its most confident boxes (here 1000 of ~4000 candidates)
    for conf, max_det, max_nms in ((0.001, 300, 30000), (0.25, 20, 30000), (0.001, 300, 1000)):
        got = batched_val.batched_nms(prediction, conf, 0.7, max_det=max_det, max_nms=max_nms)
        want = non_max_suppression(prediction, conf, 0.7, multi_label=True, max_det=max_det, max_nms=max_nms)
        assert got.counts == [len(w) for w in want] and got.counts[1] == 0 and max(got.counts) > 0
        for i, w in enumerate(want):
            n = got.counts[i]
            assert torch.equal(got.boxes[i, :n], w[:, :4]) and torch.equal(got.conf[i, :n], w[:, 4])
            assert torch.equal(got.cls[i, :n], w[:, 5]) and bool((got.cls[i, n:] == -1).all())


def _validate(cls: type, data: Path, checkpoint: Path) -> tuple[dict, dict]:
    """(metrics, each image's TP/FP/FN at IoU 0.5) of a standalone validation at conf 0.001: hundreds of boxes an
    image, most of them low-confidence ones that compete for the same labels."""
    v = cls(args={"data": str(data / "data.yaml"), "imgsz": 128, "batch": 16, "plots": False, "conf": 0.001})
    stats = v(model=str(checkpoint))
    return stats, v.metrics.box.image_metrics


def test_metrics_are_ultralytics_validator_on_trained_weights(device_run: Path, shapes: Path) -> None:
    """The device-loader learning run's best.pt (not ddp_run's: that run registers the model test_tracking reads, and
    must register after test_faults' weaker run, as it does when test_launcher first asks for it)."""
    from ultralytics.models.yolo.detect import DetectionValidator

    from yolo_ray.worker.batched_val import BatchedDetectionValidator

    want, want_images = _validate(DetectionValidator, shapes, weights(device_run) / "best.pt")
    got, got_images = _validate(BatchedDetectionValidator, shapes, weights(device_run) / "best.pt")
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k], abs=1e-3) for k in want), (got, want)
    assert got_images == want_images  # each image's TP, FP and FN at IoU 0.5
    assert want["metrics/mAP50-95(B)"] > 0.3  # trained: the matching decides real scores


def test_final_eval_validates_in_the_trained_layout_with_the_same_metrics(device_run: Path, shapes: Path) -> None:
    """final_eval on a GPU reloads best.pt in the layout training validated in (cuDNN's plans for the val shapes are
    reused instead of rebuilt) and skips AutoBackend's warm-up: the metrics are those of Ultralytics' NCHW reload."""
    from types import SimpleNamespace

    from ultralytics.nn.autobackend import AutoBackend
    from ultralytics.nn.tasks import DetectionModel

    from yolo_ray.worker.batched_val import BatchedDetectionValidator
    from yolo_ray.worker.trainer import _final_val_as_trained

    best = weights(device_run) / "best.pt"
    args = {"data": str(shapes / "data.yaml"), "imgsz": 128, "batch": 16, "plots": False, "conf": 0.001}
    nchw = BatchedDetectionValidator(args=dict(args))
    want = nchw(model=str(best))
    trained = DetectionModel("yolo11n.yaml", nc=1, verbose=False).to(memory_format=torch.channels_last)
    validator = BatchedDetectionValidator(args=dict(args))
    trainer = SimpleNamespace(device=torch.device("cuda"), validator=validator, ema=SimpleNamespace(ema=trained))
    warmup = AutoBackend.warmup
    with _final_val_as_trained(trainer):
        assert validator.args.channels_last is True and AutoBackend.warmup is not warmup
        got = validator(model=str(best))
    assert validator.args.channels_last is nchw.args.channels_last and AutoBackend.warmup is warmup  # put back
    assert all(got[k] == pytest.approx(want[k], abs=1e-3) for k in want), (got, want)
    assert want["metrics/mAP50-95(B)"] > 0.3

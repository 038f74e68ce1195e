"""Validation's NMS kernel (issue #23): greedy NMS with one Triton program per image, every image of a batch at once,
against what the batched validator does off the KERNEL_DEVICES (worker/batched_val.py: each image's top NMS_PREFIX
boxes, images side by side in torchvision calls of up to NMS_BOXES boxes).

The kernel is worker/nms_kernel.py (why it is faster: its docstring).

Checks that both keep the same boxes of every image (the kernel walks the boxes in the order given, so torchvision is
given that order), then times each, the device synchronized; then the validator's whole NMS (batched_nms) with its
rounds in torchvision and in the kernel: the same detections, and each one's time. On a CPU the kernel runs in
Triton's interpreter (slow: for the tests, not for figures).

    python benchmarks/nms_kernel_probe.py [--images 64] [--classes 5] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nms_prefix_probe import repeat_timed, young_output  # noqa: E402  (young_output: the most boxes NMS sees)

from yolo_ray.worker import batched_val  # noqa: E402
from yolo_ray.worker.nms_kernel import greedy_nms_per_image  # noqa: E402


def top_boxes(prediction: torch.Tensor, conf: float, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image's k most confident candidates as the validator ranks them (class-offset xyxy, float32, as
    Ultralytics gives torchvision), padded: ([B, k, 4], counts [B])."""
    bs, channels, _ = prediction.shape
    pred = prediction.transpose(-1, -2)
    img, anchor, cls = torch.where(pred[..., 4:] > conf)
    boxes = batched_val.ops.xywh2xyxy(pred[..., :4])[img, anchor].float() + cls[:, None].float() * batched_val.MAX_WH
    scores = pred[..., 4:][img, anchor, cls].float()
    order = scores.argsort(descending=True, stable=True)
    order = order[img[order].argsort(stable=True)]  # by image, each in descending score
    candidates = torch.bincount(img, minlength=bs)
    rank = batched_val._rank_in_image(img[order], candidates)
    take = order[rank < k]
    counts = candidates.clamp(max=k)
    at = (img[take], batched_val._rank_in_image(img[take], counts))
    return batched_val._padded_by_image(boxes[take], at, bs, k), counts


def torchvision_keep(boxes: torch.Tensor, counts: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """What the batched validator does with these rows now: images side by side (moved apart in float64), in calls of
    up to NMS_BOXES boxes; scores that keep the given order."""
    import torchvision

    bs, k, _ = boxes.shape
    live = torch.arange(k, device=boxes.device)[None] < counts[:, None]
    img, row = torch.where(live)
    moved = boxes[img, row].double() + (img.double() * batched_val.MAX_WH * 64)[:, None]
    scores = -torch.arange(img.numel(), device=boxes.device, dtype=torch.float64)  # the walking order
    per_image = counts.tolist()
    spans = batched_val._spans([n for n in per_image if n])
    kept = torch.cat([a + torchvision.ops.nms(moved[a:b], scores[a:b], iou_thres) for a, b in spans])
    keep = torch.zeros(bs, k, dtype=torch.bool, device=boxes.device)
    keep[img[kept], row[kept]] = True
    return keep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--classes", type=int, default=5)
    ap.add_argument("--k", type=int, default=batched_val.NMS_PREFIX)
    ap.add_argument("--iou", type=float, default=0.7)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    boxes, counts = top_boxes(young_output(a.images, a.classes, device), 0.001, a.k)
    cuda = device.type == "cuda"
    tv_s, tv = repeat_timed(lambda: torchvision_keep(boxes, counts, a.iou), a.repeats, cuda)
    kernel_s, kernel = repeat_timed(lambda: greedy_nms_per_image(boxes, counts, a.iou), a.repeats, cuda)
    differing = int((tv != kernel).any(1).sum())
    prediction = young_output(a.images, a.classes, device)
    nms = {}  # the validator's whole NMS (batched_val.batched_nms), its rounds in torchvision or in the kernel
    for name, devices in (("torchvision", ()), ("kernel", (device.type,))):
        batched_val.KERNEL_DEVICES = devices
        nms[name] = repeat_timed(lambda: batched_val.batched_nms(prediction, 0.001, a.iou, max_det=300), a.repeats,
                                 cuda)  # fmt: skip
    (tv_nms_s, want), (kernel_nms_s, got) = nms["torchvision"], nms["kernel"]
    same = got.counts == want.counts and all(torch.equal(x, y) for x, y in zip(
        (got.boxes, got.conf, got.cls), (want.boxes, want.conf, want.cls), strict=True))  # fmt: skip
    out = {
        "what": "greedy NMS, one Triton program per image, against torchvision calls of images side by side",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (Triton's interpreter)",
        "images": a.images, "boxes_per_image": a.k, "kept_per_image": round(float(tv.sum(1).float().mean()), 1),
        "images_differing": differing,
        "torchvision_s": [round(s, 5) for s in tv_s], "kernel_s": [round(s, 5) for s in kernel_s],
        "speedup": round(statistics.median(tv_s) / statistics.median(kernel_s), 2),
        "batched_nms_same_detections": same,
        "batched_nms_torchvision_s": [round(s, 5) for s in tv_nms_s],
        "batched_nms_kernel_s": [round(s, 5) for s in kernel_nms_s],
        "batched_nms_speedup": round(statistics.median(tv_nms_s) / statistics.median(kernel_nms_s), 2),
    }  # fmt: skip
    print(json.dumps(out))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

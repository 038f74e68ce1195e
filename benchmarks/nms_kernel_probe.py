"""A candidate for validation's NMS beside training (issue #23): greedy NMS with one Triton program per image, every
image of a batch at once, against what the batched validator does now (worker/batched_val.py: each image's top
NMS_PREFIX boxes, images side by side in torchvision calls of up to NMS_BOXES boxes).

Why: beside training, NMS took 1.0-2.2 ms an image against 0.26 for the forward pass
(benchmarks/results/2026-12-06-h100-val-thread-stream-priority-and-cpu-forward.json). torchvision's CUDA NMS builds a
mask quadratic in a call's boxes (16 images' 2048 boxes: 32,768) and reduces it in one thread block, one box after
another: a batch of 64 images is ~131,000 boxes in turn on one SM. Here each image's loop runs in a program of its
own, over its own 2048 boxes, all images in parallel. Not used by the validator until this probe has timed it on a
GPU and found the same detections.

Checks that both keep the same boxes of every image (the kernel walks the boxes in the order given, so torchvision is
given that order), then times each, the device synchronized. On a CPU the kernel runs in Triton's interpreter (slow:
for the tests, not for figures).

    python benchmarks/nms_kernel_probe.py [--images 64] [--classes 5] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nms_prefix_probe import repeat_timed, young_output  # noqa: E402  (young_output: the most boxes NMS sees)

from yolo_ray.worker import batched_val  # noqa: E402


def _greedy_per_image(boxes_ptr: Any, counts_ptr: Any, removed_ptr: Any, k: Any, iou_thres: Any,
                      BLOCK: tl.constexpr):  # fmt: skip
    """Program b: image b's first counts[b] boxes of boxes[b] (xyxy, in the order to walk them, most confident first):
    a box is kept unless a kept box before it overlaps it by more than iou_thres (torchvision's IoU and test).
    removed[b] (zeros in, int8) ends 1 where a box is not kept; it is also where the loop reads whether box i still
    stands (a load, not a reduction over the block), so each update is stored and the block synchronized."""
    b = tl.program_id(0)
    n = tl.load(counts_ptr + b)
    offs = tl.arange(0, BLOCK)
    live = offs < n
    row = boxes_ptr + b * k * 4 + offs * 4
    x1 = tl.load(row, mask=live, other=0.0)
    y1 = tl.load(row + 1, mask=live, other=0.0)
    x2 = tl.load(row + 2, mask=live, other=0.0)
    y2 = tl.load(row + 3, mask=live, other=0.0)
    area = (x2 - x1) * (y2 - y1)
    flags = removed_ptr + b * k + offs
    removed = (offs < 0).to(tl.int8)  # zeros (tl.zeros is not in the interpreter)
    for i in range(0, n):
        if tl.load(removed_ptr + b * k + i) == 0:  # box i is kept: it removes what it overlaps after it
            box = boxes_ptr + (b * k + i) * 4
            bx1, by1, bx2, by2 = tl.load(box), tl.load(box + 1), tl.load(box + 2), tl.load(box + 3)
            w = tl.maximum(tl.minimum(x2, bx2) - tl.maximum(x1, bx1), 0.0)
            h = tl.maximum(tl.minimum(y2, by2) - tl.maximum(y1, by1), 0.0)
            inter = w * h
            iou = inter / ((bx2 - bx1) * (by2 - by1) + area - inter)
            removed = removed | ((iou > iou_thres) & (offs > i)).to(tl.int8)
            tl.store(flags, removed, mask=live)
            tl.debug_barrier()


@functools.cache
def _kernel(interpret: bool) -> Any:
    if interpret:  # CPU tensors: Triton's interpreter (tests)
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_greedy_per_image)
    return triton.jit(_greedy_per_image)


def greedy_nms_per_image(boxes: torch.Tensor, counts: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """boxes [B, K, 4] float32 xyxy, each image's rows in walking order; counts [B]: its valid rows. -> keep [B, K]."""
    n_images, k, _ = boxes.shape
    removed = torch.zeros(n_images, k, dtype=torch.int8, device=boxes.device)
    if n_images and k:
        block = triton.next_power_of_2(k)
        _kernel(not boxes.is_cuda)[(n_images,)](
            boxes.float().contiguous(), counts.to(torch.int32).contiguous(), removed, k, iou_thres, BLOCK=block,
            num_warps=8 if block >= 1024 else 4,
        )  # fmt: skip
    return (removed == 0) & (torch.arange(k, device=boxes.device)[None] < counts[:, None])


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
    out = boxes.new_zeros(bs, k, 4)
    out[img[take], batched_val._rank_in_image(img[take], counts)] = boxes[take]
    return out, counts


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
    out = {
        "what": "greedy NMS, one Triton program per image, against torchvision calls of images side by side",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (Triton's interpreter)",
        "images": a.images, "boxes_per_image": a.k, "kept_per_image": round(float(tv.sum(1).float().mean()), 1),
        "images_differing": differing,
        "torchvision_s": [round(s, 5) for s in tv_s], "kernel_s": [round(s, 5) for s in kernel_s],
        "speedup": round(statistics.median(tv_s) / statistics.median(kernel_s), 2),
    }  # fmt: skip
    print(json.dumps(out))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

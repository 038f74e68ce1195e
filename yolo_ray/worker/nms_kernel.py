"""Greedy NMS with one Triton program per image: every image of a validation batch at once, each over its own most
confident boxes (batched_val's first round, NMS_PREFIX of them).

Why: torchvision's CUDA NMS builds a mask quadratic in a call's boxes and then walks it in one thread block, one box
after another: images side by side in one call (16 images' 2048 boxes: 32,768) are walked in turn on one SM, and
beside training that walk was most of validation's time (benchmarks/results/
2026-12-06-h100-val-thread-stream-priority-and-cpu-forward.json: NMS 1.0-2.2 ms an image, the forward 0.26). Here
each image walks its own boxes in a program of its own, all images in parallel. The IoU and its test are
torchvision's, in float32 as Ultralytics gives them to it.

On CPU tensors the kernel runs in Triton's interpreter (the tests). The validator uses it on the devices named in
batched_val.KERNEL_DEVICES (CUDA): on an H100, 64 images of 2048 boxes in 1.6 ms against torchvision's 270 ms, the
same boxes kept (benchmarks/nms_kernel_probe.py; benchmarks/results/2026-12-07-h100-nms-kernel-probe.json).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from yolo_ray import triton_kernels

MAX_BOXES = 4096  # boxes one program walks: its block holds each box's coordinates in registers
# the block of every call of up to MIN_BLOCK boxes an image (batched_val's rounds: NMS_PREFIX): one compiled variant.
# Sized to each call, a block would be compiled anew (~0.6 s, in a validation) whenever the boxes an image crossed a
# power of two as the model trained; for the same reason k is not specialized (Triton compiles a variant for ints
# divisible by 16 and for 1). Below 2048 a wider block only walks masked lanes: microseconds a batch.
MIN_BLOCK = 2048


def _greedy_per_image(boxes_ptr, counts_ptr, removed_ptr, k, iou_thres, BLOCK: tl.constexpr):
    # (the runtime arguments go unannotated: Triton's compiler reads an annotation as a global it cannot reach)
    """Program b: image b's first counts[b] boxes of boxes[b] (xyxy, in the order to walk them, most confident first):
    a box is kept unless a kept box before it overlaps it by more than iou_thres. removed[b] (zeros in, int8) ends 1
    where a box is not kept; it is also where the loop reads whether box i still stands (a load, not a reduction over
    the block), so each update is stored and the block synchronized."""
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


def launcher(interpret: bool) -> Any:
    """The kernel as greedy_nms_per_image launches it: compiled (on GPU tensors) with k unspecialized, or interpreted.
    One object per mode (triton_kernels.launcher's cache), whose compiled variants tests can count."""
    return triton_kernels.launcher(_greedy_per_image, interpret, do_not_specialize=("k",))


def greedy_nms_per_image(boxes: torch.Tensor, counts: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """boxes [B, K, 4] xyxy (K <= MAX_BOXES), each image's rows in walking order; counts [B]: its valid rows.
    -> keep [B, K] (False past counts)."""
    n_images, k, _ = boxes.shape
    if k > MAX_BOXES:
        raise ValueError(f"{k} boxes an image: the kernel walks at most {MAX_BOXES}")
    removed = torch.zeros(n_images, k, dtype=torch.int8, device=boxes.device)
    if n_images and k:
        block = max(triton.next_power_of_2(k), MIN_BLOCK)
        launcher(not boxes.is_cuda)[(n_images,)](
            boxes.float().contiguous(), counts.to(torch.int32).contiguous(), removed, k, iou_thres, BLOCK=block,
            num_warps=8,
        )  # fmt: skip
    return (removed == 0) & (torch.arange(k, device=boxes.device)[None] < counts[:, None])

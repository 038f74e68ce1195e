"""Detection validation batched over images, on the validator's device (task detect).

Ultralytics' DetectionValidator runs NMS and matches predictions to labels one image at a time: per image a dozen
torch ops, then a numpy loop over its detections. That Python holds the GIL, which is what validating on a thread
of the training process costs training (benchmarks/results/2026-12-03-h200-val-thread-gil.json). Here NMS runs
once per batch and the matching once per validation, all images at once; the scores come from Ultralytics' own
metrics code, fed the per-image arrays its validator would have fed it. Plots, JSON and txt output (final_eval,
the last epoch) keep Ultralytics' per-image path.

Imports Ultralytics: import it in the worker once its environment is set (as trainer.py), never from loop.py's imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ultralytics.models.yolo.detect import DetectionValidator
from ultralytics.utils import ops

from yolo_ray.console import say

MAX_WH = 7680  # Ultralytics' per-class NMS offset (nms.non_max_suppression's max_wh)
NMS_BOXES = 1 << 15  # boxes one torchvision NMS call takes (its mask: boxes^2 / 8 bytes, 128 MB)
NMS_PREFIX = 2048  # each image's most confident boxes NMS tries first (_greedy_keep)
# where NMS rounds run nms_kernel: on a GPU it keeps torchvision's boxes, 58x faster over the validator's whole NMS
# (benchmarks/results/2026-12-07-h100-nms-kernel-probe.json). Not the CPU: there it would be Triton's interpreter. A
# device the kernel fails on (no Triton, a GPU it cannot compile for) leaves this for the rest of the process.
KERNEL_DEVICES: tuple[str, ...] = ("cuda",)
MATCH_ELEMENTS = 1 << 26  # IoU entries one matching pass holds on the device (256 MB of float32)


@dataclass
class Detections:
    """A batch's detections after NMS, padded: image i's first counts[i] rows, in descending confidence."""

    boxes: torch.Tensor  # [B, P, 4] xyxy, letterboxed pixels
    conf: torch.Tensor  # [B, P]
    cls: torch.Tensor  # [B, P], -1 past counts[i]
    counts: list[int]


def batched_nms(prediction: torch.Tensor, conf_thres: float, iou_thres: float, *, max_det: int,
                max_nms: int = 30000, agnostic: bool = False) -> Detections:  # fmt: skip
    """Ultralytics' non_max_suppression (multi-label, class-aware unless agnostic) for a whole batch, in as few
    torchvision calls as NMS_BOXES allows (on each image's top boxes first: _greedy_keep): each image's boxes are
    moved out of every other image's reach, in float64 so that the move is exact (an image's boxes and their class
    offsets are Ultralytics' float32 values)."""
    if isinstance(prediction, (list, tuple)):  # training-mode model output: (inference, loss inputs)
        prediction = prediction[0]
    bs, channels, _ = prediction.shape
    nc = channels - 4
    pred = prediction.transpose(-1, -2)
    img, anchor, cls = torch.where(pred[..., 4:] > conf_thres)  # image-major, then anchor, then class: as upstream
    boxes = ops.xywh2xyxy(pred[..., :4])[img, anchor].float()
    scores = pred[..., 4:][img, anchor, cls].float()
    cls = cls.float()
    offset = boxes + cls[:, None] * (0 if agnostic else MAX_WH)  # float32, as upstream
    keep = _greedy_keep(offset, scores.double(), img, bs, MAX_WH * (nc + 1), iou_thres, max_det, max_nms)
    kept = torch.bincount(img[keep], minlength=bs)
    rank = _rank_in_image(img[keep], kept)
    keep, rank = keep[rank < max_det], rank[rank < max_det]
    counts = kept.clamp(max=max_det).tolist()
    width = max(counts, default=0)
    at = (img[keep], rank)
    return Detections(_padded_by_image(boxes[keep], at, bs, width), _padded_by_image(scores[keep], at, bs, width),
                      _padded_by_image(cls[keep], at, bs, width, -1.0), counts)  # fmt: skip


def _greedy_keep(offset: torch.Tensor, scores: torch.Tensor, img: torch.Tensor, bs: int, gap: float,
                 iou_thres: float, max_det: int, max_nms: int) -> torch.Tensor:  # fmt: skip
    """The rows torchvision's NMS keeps of each image's max_nms most confident (as upstream), by image, each in
    descending score. Greedy NMS keeps a box when no kept box of higher score overlaps it, so what it keeps of an
    image's top k is what it keeps of all of them, cut to that top k: once max_det are kept there, the rest cannot
    reach the output. So each image is tried on its top NMS_PREFIX first, and only images still short try 8x as
    many (a young model gives ~30,000 candidates an image, and the call's mask is quadratic in them). On the
    KERNEL_DEVICES, rounds of up to nms_kernel.MAX_BOXES an image walk every image at once (offset: the float32 boxes
    upstream gives torchvision); larger ones, and other devices, call torchvision on images side by side (_apart:
    the rows each call takes, moved apart by image)."""
    import torchvision

    candidates = torch.bincount(img, minlength=bs)
    rows = candidates.clamp(max=max_nms)
    order = scores.argsort(descending=True, stable=True)
    order = order[img[order].argsort(stable=True)]  # by image, each in descending score
    img_in_order = img[order]
    rank = _rank_in_image(img_in_order, candidates)
    pending = torch.ones(bs, dtype=torch.bool, device=img.device)
    parts, k = [], NMS_PREFIX
    while True:
        k = min(k, int(rows.max()))
        take = order[(rank < rows.clamp(max=k)[img_in_order]) & pending[img_in_order]]
        keep = _kernel_keep(offset, take, img, bs, k, iou_thres)
        if keep is None:
            per_image = torch.bincount(img[take], minlength=bs).tolist()
            calls = [take[a:b] for a, b in _spans([n for n in per_image if n])]  # whole images, by image
            keep = torch.cat([c[torchvision.ops.nms(_apart(offset, img, c, gap), scores[c], iou_thres)] for c in calls])
        done = pending & ((torch.bincount(img[keep], minlength=bs) >= max_det) | (rows <= k))
        parts.append(keep[done[img[keep]]])
        pending &= ~done
        if not bool(pending.any()):
            keep = torch.cat(parts)  # each image from one round, in descending score (as each round returns them)
            return keep[img[keep].argsort(stable=True)]
        k *= 8


def warm_kernel(device: torch.device) -> None:
    """Compile validation's NMS kernel for `device` now, on one box (every round runs the one variant: nms_kernel.
    MIN_BLOCK): its first compile (~0.6 s) is then off the first validation. A kernel that fails here falls back to
    torchvision as it would in validation, with the same one line."""
    one = torch.zeros(1, dtype=torch.long, device=device)
    _kernel_keep(torch.zeros(1, 4, device=device), one, one, 1, 1, 0.5)


def _apart(offset: torch.Tensor, img: torch.Tensor, rows: torch.Tensor, gap: float) -> torch.Tensor:
    """The rows' boxes, each image's moved gap * its index out of the others' reach (float64: the move is exact)."""
    return offset[rows].double() + (img[rows].double() * gap)[:, None]


def _kernel_keep(offset: torch.Tensor, take: torch.Tensor, img: torch.Tensor, bs: int, k: int,
                 iou_thres: float) -> torch.Tensor | None:  # fmt: skip
    """The rows of take (by image, each in descending score, at most k an image) that greedy NMS keeps, with one
    kernel program per image; in take's order. None where the kernel does not run this round: off the
    KERNEL_DEVICES, more than its MAX_BOXES an image, or failing (then never again on this device type)."""
    device = offset.device.type
    if device not in KERNEL_DEVICES:
        return None
    try:
        from yolo_ray.worker import nms_kernel  # imports Triton: only where the kernel runs
    except Exception as e:  # no Triton, or one that fails to load
        return _kernel_failed(device, e)
    if k > nms_kernel.MAX_BOXES:
        return None
    at_img = img[take]
    counts = torch.bincount(at_img, minlength=bs)
    pos = _rank_in_image(at_img, counts)
    boxes = _padded_by_image(offset[take], (at_img, pos), bs, k)
    try:  # the kernel alone: an error in the validator's own indexing is a bug to see, not the kernel's failure
        keep = nms_kernel.greedy_nms_per_image(boxes, counts, iou_thres)
    except Exception as e:  # an optional fast path: validation goes on with torchvision's NMS, the same detections
        return _kernel_failed(device, e)
    return take[keep[at_img, pos]]


def _kernel_failed(device: str, e: Exception) -> None:
    """The kernel off for this device type from now on, said once."""
    global KERNEL_DEVICES
    KERNEL_DEVICES = tuple(d for d in KERNEL_DEVICES if d != device)
    say(f"[yolo_ray] validation's NMS kernel failed on {device} ({type(e).__name__}: {str(e)[:300]}); "
        "torchvision's NMS from now on (the same detections, slower)")  # fmt: skip


def _spans(per_image: list[int]) -> list[tuple[int, int]]:
    """Row ranges of whole images, each at most NMS_BOXES rows unless one image alone has more: torchvision's NMS
    keeps a mask quadratic in its boxes, so one call for a young model's batch (millions of boxes) cannot run."""
    spans, start, end = [], 0, 0
    for n in per_image:
        if end > start and end - start + n > NMS_BOXES:
            spans.append((start, end))
            start = end
        end += n
    return [*spans, (start, end)]


def _padded_by_image(rows: torch.Tensor, at: tuple[torch.Tensor, torch.Tensor], bs: int, width: int,
                     fill: float = 0.0) -> torch.Tensor:  # fmt: skip
    """rows placed at (image, position in it) of a [bs, width, ...] tensor, fill elsewhere."""
    out = rows.new_full((bs, width, *rows.shape[1:]), fill)
    out[at] = rows
    return out


def _rank_in_image(img: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each row's position among its image's rows (img sorted; counts: each image's rows, the caller's bincount)."""
    return torch.arange(img.numel(), device=img.device) - (torch.cumsum(counts, 0) - counts)[img]


def box_iou_batched(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Ultralytics' box_iou, image by image: a [N, G, 4], b [N, P, 4] -> [N, G, P] (the same float32 ops)."""
    (a1, a2), (b1, b2) = a.float()[:, :, None].chunk(2, 3), b.float()[:, None].chunk(2, 3)
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp_(0).prod(3)
    return inter / ((a2 - a1).prod(3) + (b2 - b1).prod(3) - inter + eps)


def match_greedy(iou: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Ultralytics' match_predictions for many images at once: iou [N, G, P] (labels x detections in descending
    confidence, 0 where classes differ) -> correct [N, P, T]. Detections in confidence order each claim their best
    unclaimed label per threshold. One that overlaps no label by the lowest threshold claims nothing, so the loop runs
    over the others only, moved to the front: as many steps as one image has of them at most."""
    n, g, p = iou.shape
    t = thresholds.numel()
    correct = torch.zeros(n, p, t, dtype=torch.bool, device=iou.device)
    candidate = (iou >= thresholds.min()).any(1)  # [N, P]
    steps = int(candidate.sum(1).max()) if candidate.numel() else 0
    if not steps:
        return correct
    order = torch.argsort((~candidate).to(torch.int8), dim=1, stable=True)[:, :steps]  # candidates first, in order
    columns = iou.gather(2, order[:, None].expand(n, g, steps))
    claimed = torch.zeros(n, g, t, dtype=torch.bool, device=iou.device)
    hits = torch.zeros(n, steps, t, dtype=torch.bool, device=iou.device)
    for k in range(steps):
        available = torch.where(claimed, 0.0, columns[:, :, k, None])  # [N, G, T]
        label = available.argmax(1, keepdim=True)  # the first of equals, as numpy's argmax
        hit = available.gather(1, label) >= thresholds  # [N, 1, T]
        hits[:, k] = hit[:, 0]
        claimed.scatter_(1, label, claimed.gather(1, label) | hit)
    hits &= candidate.gather(1, order)[..., None]
    return correct.scatter_(1, order[..., None].expand(n, steps, t), hits)


@dataclass
class _Pending:
    """One batch's detections and labels, waiting for the matching at the validation's end."""

    iou: torch.Tensor  # [B, G, P]
    det: Detections
    label_cls: list[np.ndarray]  # per image
    names: list[str]


class BatchedDetectionValidator(DetectionValidator):
    """Ultralytics' DetectionValidator with NMS per batch and matching per validation. Used through batched()."""

    def init_metrics(self, model: torch.nn.Module) -> None:
        super().init_metrics(model)
        a = self.args
        self.batched = not (a.plots or a.save_json or a.save_txt or a.visualize or self.end2end)
        self.waiting: list[_Pending] = []

    def postprocess(self, preds: torch.Tensor) -> Any:
        if not self.batched:
            return super().postprocess(preds)
        a = self.args
        return batched_nms(preds, a.conf, a.iou, max_det=a.max_det, agnostic=a.single_cls or a.agnostic_nms)

    def update_metrics(self, preds: Any, batch: dict[str, Any]) -> None:
        if not self.batched:
            return super().update_metrics(preds, batch)
        bs = len(preds.counts)
        self.seen += bs
        if self.args.single_cls:
            preds.cls[preds.cls >= 0] = 0
        img = batch["batch_idx"].long()  # labels come image by image (Ultralytics' collate)
        per_image = torch.bincount(img, minlength=bs)
        counts = per_image.tolist()
        at = (img, _rank_in_image(img, per_image))
        width, (h, w) = max(counts, default=0), batch["img"].shape[2:]
        scale = torch.tensor((w, h, w, h), device=batch["bboxes"].device)
        labels = _padded_by_image(ops.xywh2xyxy(batch["bboxes"]) * scale, at, bs, width)
        label_cls = _padded_by_image(batch["cls"].view(-1), at, bs, width, -2.0)
        iou = box_iou_batched(labels, preds.boxes) * (label_cls[:, :, None] == preds.cls[:, None, :])
        cls = np.split(batch["cls"].view(-1).cpu().numpy(), np.cumsum(counts)[:-1])
        names = [Path(f).name for f in batch["im_file"]]
        self.waiting.append(_Pending(iou, preds, cls, names))

    def gather_stats(self) -> None:
        if self.batched:
            self._match_pending()
        super().gather_stats()

    def _match_pending(self) -> None:
        """Match every waiting batch, as few passes as MATCH_ELEMENTS allows, and hand each image's arrays to
        Ultralytics' metrics in the loader's order."""
        pending, self.waiting = self.waiting, []
        while pending:
            group = [pending.pop(0)]
            while pending and _elements([*group, pending[0]]) <= MATCH_ELEMENTS:
                group.append(pending.pop(0))
            g = max(p.iou.shape[1] for p in group)
            width = max(p.iou.shape[2] for p in group)
            iou = torch.cat([_pad(p.iou, (g, width)) for p in group])
            correct = match_greedy(iou, self.iouv.to(iou.device)).cpu().numpy()
            conf = torch.cat([_pad(p.det.conf, (width,)) for p in group]).cpu().numpy()
            cls = torch.cat([_pad(p.det.cls, (width,)) for p in group]).cpu().numpy()
            i = 0
            for p in group:
                for n, label_cls, name in zip(p.det.counts, p.label_cls, p.names, strict=True):
                    self.metrics.update_stats({
                        "tp": correct[i, :n],
                        "target_cls": label_cls,
                        "target_img": np.unique(label_cls),
                        "conf": conf[i, :n] if n else np.zeros(0),
                        "pred_cls": cls[i, :n] if n else np.zeros(0),
                        "im_name": name,
                    })  # fmt: skip
                    i += 1


def _elements(group: list[_Pending]) -> int:
    return sum(p.iou.shape[0] for p in group) * max(p.iou.shape[1] for p in group) * max(p.iou.shape[2] for p in group)


def _pad(x: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """x zero-padded at the end of its trailing dims to `size` (its first dim kept)."""
    pads: list[int] = []
    for have, want in zip(reversed(x.shape[1:]), reversed(size), strict=True):
        pads += [0, want - have]
    return torch.nn.functional.pad(x, pads)


def batched(validator: Any) -> Any:
    """The validator, as a BatchedDetectionValidator when it is Ultralytics' plain DetectionValidator (its subclasses,
    the other tasks' validators, have per-image matching of their own and keep it). The class is swapped in place:
    the task trainer built it with arguments of its choosing."""
    if type(validator) is DetectionValidator:
        validator.__class__ = BatchedDetectionValidator
    return validator

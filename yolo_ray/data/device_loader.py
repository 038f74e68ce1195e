"""A training loader that keeps the decoded images on the training device and augments whole batches there.

Ultralytics decodes and augments each image on the CPU (mosaic, random affine, HSV, flips). On an H200 host that
feeds YOLO11n about 1000 images/s per 32 cores while the training step alone runs twice as fast. This loader decodes
every image once, with Ultralytics' own `load_image` (long side = imgsz), keeps the images as uint8 on the device,
and augments a whole batch there, moving the boxes (and a pose dataset's keypoints) with the image (random parameters
and labels as batched tensor ops; the pixels in one fused Triton kernel on CUDA, augment_kernel.py, or as torch ops,
the reference, on CPU):

    mosaic (p = hyp.mosaic) -> random affine (degrees, translate, scale, shear) -> HSV -> flips

The random parameters follow Ultralytics' distributions (Mosaic centre, RandomPerspective._compute_affine_matrix,
RandomHSV, RandomFlip) and boxes go through its filters (clip, zero-area removal, box_candidates); keypoints go
through the same affine, turn invisible where they leave the canvas or the image, and are reordered by the dataset's
flip_idx when an image is mirrored (as Instances.clip, RandomPerspective.apply_keypoints and RandomFlip
do). Segment masks and rotated boxes are not moved (inputs.check_task_paths refuses those tasks). Not reproduced:
perspective, mixup, cutmix, copy_paste (config_checks.check_static refuses them with this loader) and the optional
albumentations blur/CLAHE. Memory: images x imgsz^2 x 3 bytes per worker (data.device_cache: sharded divides it by
the workers).
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

PAD = 114.0  # Ultralytics' border grey


@dataclass
class AugmentHyp:
    """The augmentation hyperparameters of an Ultralytics train config that this loader reproduces."""

    mosaic: float = 1.0
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    fliplr: float = 0.5
    flipud: float = 0.0

    @classmethod
    def from_args(cls, args: Any) -> AugmentHyp:
        return cls(**{k: float(getattr(args, k)) for k in cls.__dataclass_fields__})


class DeviceCache:
    """Training images decoded once: uint8 RGB, top-left aligned in an imgsz x imgsz slot, plus their labels. Row i
    holds dataset image ids[i] (a sharded cache: this rank's share) or image i (ids None: all of them)."""

    def __init__(
        self,
        images: torch.Tensor,
        hw: torch.Tensor,
        labels: Labels,
        ids: list[int] | None = None,
        flip_idx: list[int] | None = None,
    ):
        self.images = images  # [N, S, S, 3] uint8
        self.hw = hw  # [N, 2] resized (h, w)
        self.boxes = labels.boxes  # [N, K, 4] xyxy pixels of the resized image
        self.cls = labels.cls  # [N, K]
        self.valid = labels.valid  # [N, K] bool: padding rows are False
        self.keypoints = labels.keypoints  # [N, K, nk, 3] (x, y pixels, visibility); None: not a pose dataset
        self.flip_idx = flip_idx  # keypoint order in a mirrored image (data.yaml)
        self.ids = ids
        self.size = images.shape[1]

    def __len__(self) -> int:
        return self.images.shape[0]

    @functools.cached_property
    def pixel_grid(self) -> torch.Tensor:
        """[1, S*S, 3] (x, y, 1) of every output pixel, built once: only the torch reference path (_warp) reads it."""
        axis = torch.arange(self.size, device=self.images.device, dtype=torch.float32)
        ys, xs = torch.meshgrid(axis, axis, indexing="ij")
        return torch.stack([xs, ys, torch.ones_like(ys)], -1).reshape(1, -1, 3)

    @staticmethod
    def nbytes(images: int, imgsz: int) -> int:
        return images * imgsz * imgsz * 3

    @classmethod
    def build(
        cls,
        dataset: Any,
        imgsz: int,
        device: torch.device,
        threads: int,
        chunk: int = 256,
        ids: list[int] | None = None,
    ) -> DeviceCache:
        """Decode with the dataset's load_image in threads (cv2 releases the GIL), a chunk at a time onto device;
        ids: only those images (a shard), in that order."""
        rows = list(range(len(dataset))) if ids is None else list(ids)
        n = len(rows)
        _check_fits(n, imgsz, device, sharded=ids is not None)
        images = torch.full((n, imgsz, imgsz, 3), int(PAD), dtype=torch.uint8, device=device)
        hw = torch.zeros(n, 2, dtype=torch.float32)
        dataset.augment = False  # no mosaic buffer: load_image then keeps nothing
        staging = torch.empty((chunk, imgsz, imgsz, 3), dtype=torch.uint8, pin_memory=device.type == "cuda")

        def load(row: int, slot: int) -> None:
            im, _, (h, w) = dataset.load_image(rows[row])
            staging[slot, :h, :w] = torch.from_numpy(np.ascontiguousarray(im[..., ::-1]))  # BGR -> RGB
            hw[row] = torch.tensor([h, w])

        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for start in range(0, n, chunk):
                part = range(start, min(n, start + chunk))
                staging.fill_(int(PAD))
                list(pool.map(load, part, range(len(part))))
                images[start : start + len(part)].copy_(staging[: len(part)], non_blocking=False)
        labels = label_tensors([dataset.labels[i] for i in rows], hw, getattr(dataset, "use_keypoints", False))
        flip_idx = (dataset.data.get("flip_idx") or None) if labels.keypoints is not None else None
        return cls(images, hw.to(device), labels.to(device), ids, flip_idx)


CACHE_SHARE = 0.6  # of the device's free memory that the decoded images may take (the rest: model, activations)


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def fits(n: int, imgsz: int, device: torch.device) -> bool:
    """Would n decoded images fit in this device's share for the cache?"""
    return DeviceCache.nbytes(n, imgsz) <= CACHE_SHARE * _free_bytes(device)


def _check_fits(n: int, imgsz: int, device: torch.device, sharded: bool = False) -> None:
    if not fits(n, imgsz, device):
        need, free = DeviceCache.nbytes(n, imgsz), _free_bytes(device)
        more = "more workers (each holds 1/num_workers of the images)" if sharded else "data.device_cache: sharded"
        raise RuntimeError(
            f"data.loader=device: the {n} decoded training images at imgsz={imgsz} need {need / 2**30:.1f} GiB on "
            f"{device}, but only {free / 2**30:.1f} GiB is free (the cache may take {CACHE_SHARE:.0%}). Fix: {more}, "
            "data.loader: ultralytics, a lower train.imgsz, or a subset (train.extra.fraction)."
        )


def shard_ids(n: int, rank: int, world_size: int, seed: int) -> list[int]:
    """This rank's images in a sharded cache: a seeded permutation of all n, padded by wrapping to a multiple of
    world_size as DistributedSampler pads (every rank then has as many batches), every world_size-th from rank.
    Disjoint across ranks apart from the padding; together, every image."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    perm += perm[: (-n) % world_size]
    return perm[rank::world_size]


class ShardSampler:
    """What DistributedSampler is to a replicated cache, for a sharded one: this rank's fixed shard, reshuffled each
    epoch (seeded by seed and epoch). Iterates dataset image ids; rows() gives the same order as cache rows."""

    def __init__(self, ids: list[int], seed: int):
        self.ids, self.seed, self.epoch = ids, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def rows(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.ids), generator=g).tolist()

    def __iter__(self) -> Any:
        return iter([self.ids[r] for r in self.rows()])

    def __len__(self) -> int:
        return len(self.ids)


class Labels(NamedTuple):
    """Every cached image's objects, padded to the most any image has."""

    boxes: torch.Tensor  # [N, K, 4] xyxy pixels
    cls: torch.Tensor  # [N, K]
    valid: torch.Tensor  # [N, K] bool
    keypoints: torch.Tensor | None  # [N, K, nk, 3] pixels and visibility

    def to(self, device: torch.device) -> Labels:
        return Labels(*(None if t is None else t.to(device) for t in self))


def label_tensors(labels: list[dict], hw: torch.Tensor, keypoints: bool = False) -> Labels:
    """Ultralytics' per-image labels (normalised xywh, keypoints normalised xy) as padded pixel tensors of each
    image at its size hw (the cache's; the stream loader's ring too)."""
    k = max(1, max(len(lb["cls"]) for lb in labels))
    n = len(labels)
    boxes = torch.zeros(n, k, 4)
    classes = torch.zeros(n, k)
    valid = torch.zeros(n, k, dtype=torch.bool)
    kpts = torch.zeros(n, k, *labels[0]["keypoints"].shape[1:]) if keypoints else None
    for i, lb in enumerate(labels):
        m = len(lb["cls"])
        if not m:
            continue
        h, w = hw[i].tolist()
        xywh = torch.from_numpy(np.asarray(lb["bboxes"], dtype=np.float32)) * torch.tensor([w, h, w, h])
        boxes[i, :m] = torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1)
        classes[i, :m] = torch.from_numpy(np.asarray(lb["cls"], dtype=np.float32).reshape(-1))
        valid[i, :m] = True
        if kpts is not None:
            kpts[i, :m] = torch.from_numpy(np.asarray(lb["keypoints"], dtype=np.float32))
            kpts[i, :m, :, :2] *= torch.tensor([w, h])
    return Labels(boxes, classes, valid, kpts)


# --------------------------------------------------------------------------------------------------- augmentation


def augment_batch(
    cache: DeviceCache, idx: torch.Tensor, hyp: AugmentHyp, g: torch.Generator, fused: bool | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One augmented batch: uint8 images [B, 3, S, S] (channels_last memory) and Ultralytics' target tensors.

    fused: the pixel work as one Triton kernel (augment_kernel; the default on CUDA) or as torch ops (the reference,
    the default on CPU). Both draw the same random numbers, so a seed gives the same batch either way."""
    s, dev, b = cache.size, cache.images.device, idx.numel()

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, device=dev)

    mosaic = rand(b) < hyp.mosaic
    tiles = torch.cat([idx[:, None], torch.randint(0, len(cache), (b, 3), generator=g, device=dev)], 1)
    layout = _mosaic_layout(cache, tiles, mosaic, rand)
    warp = _affine(b, layout.canvas, s, hyp, rand)
    # labels first: their nonzero() is the one host sync, and it then waits only for this cheap label math; the
    # pixel work below is queued behind it and runs while the host goes on to launch the training step
    targets = _targets(cache, layout, warp)
    gains = _hsv_gains(b, hyp, rand, dev)
    minv = torch.linalg.inv_ex(warp.pixels).inverse  # inv_ex: no host sync to check singularity
    if dev.type == "cuda" if fused is None else fused:
        from yolo_ray.data import augment_kernel

        sizes = layout.hw.flip(-1) * layout.active[..., None]
        params = augment_kernel.pack_params(minv, layout.canvas, layout.centre, layout.origin, sizes, gains)
        return augment_kernel.warp_hsv(cache.images, tiles, params, gains is not None, PAD), targets
    img = _warp(cache, layout, minv, hyp.mosaic > 0)
    if gains is not None:
        img = _hsv(img, gains)
    return img.round_().clamp_(0, 255).to(torch.uint8), targets


class Layout(NamedTuple):
    """Which cached images make up each sample and where they sit on its canvas."""

    tiles: torch.Tensor  # [B, 4] cache indices: the sample's own image, then 3 mosaic partners
    active: torch.Tensor  # [B, 4] bool: the partners only in mosaic samples
    hw: torch.Tensor  # [B, 4, 2] each tile's (h, w)
    origin: torch.Tensor  # [B, 4, 2] each tile's top-left corner on the canvas (x, y)
    canvas: torch.Tensor  # [B, 2] canvas (w, h)
    centre: torch.Tensor  # [B, 2] where the mosaic quadrants meet (x, y); far off the canvas for plain samples


def _mosaic_layout(cache: DeviceCache, tiles: torch.Tensor, mosaic: torch.Tensor, rand: Any) -> Layout:
    """The canvas is 2S x 2S around a random centre for mosaic samples, the image itself otherwise."""
    b, s = tiles.shape[0], cache.size
    hw = cache.hw[tiles]
    h, w = hw[..., 0], hw[..., 1]
    xc = torch.floor(s / 2 + rand(b) * s)  # Ultralytics: int(uniform(s/2, 3s/2))
    yc = torch.floor(s / 2 + rand(b) * s)
    ox = torch.stack([xc - w[:, 0], xc, xc - w[:, 2], xc], 1)
    oy = torch.stack([yc - h[:, 0], yc - h[:, 1], yc, yc], 1)
    origin = torch.stack([ox, oy], -1)
    origin = torch.where(mosaic[:, None, None], origin, torch.zeros_like(origin))
    single = torch.stack([w[:, 0], h[:, 0]], -1)
    canvas = torch.where(mosaic[:, None], torch.full_like(single, 2 * s), single)
    active = torch.cat([torch.ones_like(mosaic)[:, None], mosaic[:, None].expand(b, 3)], 1)
    centre = torch.where(mosaic[:, None], torch.stack([xc, yc], -1), torch.full_like(single, 1e9))
    return Layout(tiles, active, hw, origin, canvas, centre)


class Warp(NamedTuple):
    """Each sample's affine from its canvas to the output image, flips folded in."""

    pixels: torch.Tensor  # [B, 3, 3] for pixel indices
    coords: torch.Tensor  # [B, 3, 3] for label coordinates
    scale: torch.Tensor  # [B] the sampled scale
    mirrored: torch.Tensor  # [B] bool: flipped one way (left-right or up-down), not both (a half turn)


def _affine(b: int, canvas: torch.Tensor, s: int, hyp: AugmentHyp, rand: Any) -> Warp:
    """RandomPerspective's M = T @ S @ R @ C per sample (no perspective) with the flips folded in, once for pixel
    indices and once for label coordinates."""
    dev = canvas.device

    def uniform(lo: float | torch.Tensor, hi: float | torch.Tensor) -> torch.Tensor:
        return lo + (hi - lo) * rand(b)

    def eye() -> torch.Tensor:
        return torch.eye(3, device=dev).repeat(b, 1, 1)

    c = eye()
    c[:, 0, 2], c[:, 1, 2] = -canvas[:, 0] / 2, -canvas[:, 1] / 2
    a = uniform(-hyp.degrees, hyp.degrees) * math.pi / 180
    scale = uniform(1 - hyp.scale, 1 + hyp.scale)
    r = eye()  # cv2.getRotationMatrix2D(angle=a, center=(0, 0), scale=scale)
    r[:, 0, 0], r[:, 0, 1] = scale * torch.cos(a), scale * torch.sin(a)
    r[:, 1, 0], r[:, 1, 1] = -scale * torch.sin(a), scale * torch.cos(a)
    sh = eye()
    sh[:, 0, 1] = torch.tan(uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    sh[:, 1, 0] = torch.tan(uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    t = eye()
    t[:, 0, 2] = uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * s
    t[:, 1, 2] = uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * s
    a = t @ sh @ r @ c
    lr, ud = rand(b) < hyp.fliplr, rand(b) < hyp.flipud

    def flipped(width: float) -> torch.Tensor:  # x -> width - x where flipped (and y likewise)
        f = eye()
        f[:, 0, 0], f[:, 0, 2] = torch.where(lr, -1.0, 1.0), torch.where(lr, width, 0.0)
        f[:, 1, 1], f[:, 1, 2] = torch.where(ud, -1.0, 1.0), torch.where(ud, width, 0.0)
        return f @ a

    # np.fliplr moves pixel index x to S-1-x; a box edge at x moves to S-x
    return Warp(flipped(s - 1.0), flipped(float(s)), scale, lr ^ ud)


def _warp(cache: DeviceCache, layout: Layout, minv: torch.Tensor, mosaic_possible: bool) -> torch.Tensor:
    """Each output pixel maps back through M^-1 to the canvas, then into the one tile covering it (bilinear);
    pixels no tile covers are grey, as in cv2.warpAffine(borderValue=114) over Ultralytics' mosaic canvas."""
    tiles, active, origin, canvas, s = layout.tiles, layout.active, layout.origin, layout.canvas, cache.size
    b, dev = tiles.shape[0], tiles.device
    src = (cache.pixel_grid @ minv.transpose(1, 2))[..., :2]  # [B, S*S, 2] canvas coordinates
    on_canvas = ((src >= -0.5) & (src < canvas[:, None, :] - 0.5)).all(-1)
    out = torch.full((b, 3, s, s), PAD, device=dev)
    for q in range(4 if mosaic_possible else 1):  # decided on the host: no GPU sync
        local = src - origin[:, q, None, :]
        size = layout.hw[:, q, None, :].flip(-1)  # (w, h)
        inside = on_canvas & active[:, q, None] & ((local >= -0.5) & (local < size - 0.5)).all(-1)
        pixels = cache.images[tiles[:, q]].permute(0, 3, 1, 2).float()  # [B, 3, S, S]
        norm = (2 * local + 1) / s - 1  # grid_sample, align_corners=False: pixel index -> [-1, 1]
        sampled = F.grid_sample(
            pixels, norm.view(b, s, s, 2), mode="bilinear", padding_mode="border", align_corners=False
        )
        out = torch.where(inside.view(b, 1, s, s), sampled, out)
    return out.contiguous(memory_format=torch.channels_last)


def _hsv_gains(b: int, hyp: AugmentHyp, rand: Any, dev: torch.device) -> torch.Tensor | None:
    """RandomHSV's per-image gains U(-1, 1) x (hsv_h, hsv_s, hsv_v); None when HSV is off."""
    if not (hyp.hsv_h or hyp.hsv_s or hyp.hsv_v):
        return None
    scale = torch.tensor([hyp.hsv_h, hyp.hsv_s, hyp.hsv_v], device=dev)
    return (rand(b, 3) * 2 - 1) * scale


def _hsv(img: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """RandomHSV: hue shifted by gain_h of a turn, saturation and value scaled by 1 + gain."""
    rgb = img / 255
    r, g, bl = rgb.unbind(1)
    v, _ = rgb.max(1)
    delta = v - rgb.min(1).values
    sat = torch.where(v > 0, delta / v.clamp_min(1e-8), torch.zeros_like(v))
    d = delta.clamp_min(1e-8)
    hue = torch.where(v == r, ((g - bl) / d) % 6, torch.where(v == g, (bl - r) / d + 2, (r - g) / d + 4))
    hue = torch.where(delta > 0, hue / 6, torch.zeros_like(hue))
    hue = (hue + gains[:, 0, None, None]) % 1.0
    sat = (sat * (1 + gains[:, 1, None, None])).clamp(0, 1)
    v = (v * (1 + gains[:, 2, None, None])).clamp(0, 1)
    channels = []
    for n in (5, 3, 1):  # HSV -> RGB: f(n) = V - V*S*clamp(min(k, 4 - k), 0, 1), k = (n + 6H) mod 6
        k = (n + hue * 6) % 6
        channels.append(v - v * sat * torch.clamp(torch.minimum(k, 4 - k), 0, 1))
    return torch.stack(channels, 1).mul_(255).contiguous(memory_format=torch.channels_last)


def _targets(cache: DeviceCache, layout: Layout, warp: Warp) -> dict[str, torch.Tensor]:
    """Boxes (and keypoints) moved like the pixels and filtered as Ultralytics does; in its batch format."""
    tiles, active, origin, canvas, s = layout.tiles, layout.active, layout.origin, layout.canvas, cache.size
    b, m, scale = tiles.shape[0], warp.coords, warp.scale
    boxes = cache.boxes[tiles] + origin.repeat(1, 1, 2)[:, :, None, :]  # [B, 4, K, 4] canvas xyxy
    limit = canvas.repeat(1, 2)[:, None, None, :]
    boxes = torch.minimum(boxes.clamp_min(0), limit)  # Mosaic: clip to the canvas
    keep = cache.valid[tiles] & active[:, :, None]
    keep &= (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])  # remove_zero_area_boxes
    boxes, keep = boxes.reshape(b, -1, 4), keep.reshape(b, -1)
    cls = cache.cls[tiles].reshape(b, -1)
    corners = boxes[..., [0, 1, 2, 3, 0, 3, 2, 1]].reshape(b, -1, 2)  # RandomPerspective.apply_bboxes
    moved = corners @ m[:, :2, :2].transpose(1, 2) + m[:, None, :2, 2]
    moved = moved.reshape(b, -1, 4, 2)
    new = torch.cat([moved.amin(2), moved.amax(2)], -1).clamp(0, s)
    old = boxes * scale[:, None, None]
    w1, h1 = old[..., 2] - old[..., 0], old[..., 3] - old[..., 1]
    w2, h2 = new[..., 2] - new[..., 0], new[..., 3] - new[..., 1]
    ar = torch.maximum(w2 / (h2 + 1e-16), h2 / (w2 + 1e-16))
    keep &= (w2 > 2) & (h2 > 2) & (w2 * h2 / (w1 * h1 + 1e-16) > 0.1) & (ar < 100)  # box_candidates
    bi, j = keep.nonzero(as_tuple=True)
    sel = new[bi, j]
    xywh = torch.cat([(sel[:, :2] + sel[:, 2:]) / 2, sel[:, 2:] - sel[:, :2]], 1) / s
    targets = {"batch_idx": bi.float(), "cls": cls[bi, j][:, None], "bboxes": xywh}
    if cache.keypoints is not None:
        targets["keypoints"] = _keypoints(cache, layout, warp)[bi, j]
    return targets


def _keypoints(cache: DeviceCache, layout: Layout, warp: Warp) -> torch.Tensor:
    """[B, 4K, nk, 3] keypoints moved like the pixels, normalised: invisible where they fall off the mosaic canvas
    (Instances.clip) or off the output image (apply_keypoints), clipped to it, and reordered by flip_idx in a
    mirrored image (RandomFlip reorders at each flip, up-down too: a mirror swaps left and right; two undo it)."""
    s = cache.size
    kp = cache.keypoints[layout.tiles]  # [B, 4, K, nk, 3]
    xy = kp[..., :2] + layout.origin[:, :, None, None, :]
    limit = layout.canvas[:, None, None, None, :]
    vis = kp[..., 2] * ((xy >= 0) & (xy <= limit)).all(-1)
    xy = torch.minimum(xy.clamp_min(0), limit).flatten(1, 2)  # [B, 4K, nk, 2]
    m = warp.coords
    xy = torch.einsum("bknj,bij->bkni", xy, m[:, :2, :2]) + m[:, None, None, :2, 2]
    vis = vis.flatten(1, 2) * ((xy >= 0) & (xy <= s)).all(-1)
    out = torch.cat([xy.clamp(0, s) / s, vis[..., None]], -1)
    if cache.flip_idx is not None:
        out = torch.where(warp.mirrored[:, None, None, None], out[:, :, cache.flip_idx], out)
    return out


# --------------------------------------------------------------------------------------------------- loader


class DeviceLoader:
    """What Ultralytics' trainer uses of its train DataLoader (len, iteration, dataset, sampler, batch_size,
    drop_last, num_workers, reset, close), serving augmented batches already on the device.

    Each rank takes its DistributedSampler shard of a replicated cache, or its own images of a sharded one (mosaic
    partners then come from the shard too); the augmentation stream is seeded by (seed, epoch, rank), so a resumed
    epoch sees the same images and the same augmentations.
    """

    num_workers = 0
    drop_last = False

    def __init__(
        self, dataset: Any, cache: DeviceCache, batch_size: int, rank: int, world_size: int, hyp: AugmentHyp, seed: int
    ):
        self.dataset, self.cache, self.batch_size, self.hyp = dataset, cache, batch_size, hyp
        if cache.keypoints is not None and cache.flip_idx is None:  # as Ultralytics' v8_transforms (which warns):
            hyp.fliplr = hyp.flipud = 0.0  # keypoints without a flip order are never flipped
        self.rank, self.seed = rank, seed
        self.epochs_served: list[int] = []  # the sampler epoch of each pass, in order (rank records, tests)
        self.sampler: DistributedSampler | ShardSampler = (
            DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
            if cache.ids is None
            else ShardSampler(cache.ids, seed)
        )

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Any:
        dev = self.cache.images.device
        self.epochs_served.append(self.sampler.epoch)
        if isinstance(self.sampler, ShardSampler):  # cache rows, and the dataset images they hold
            rows = self.sampler.rows()
            order = [self.sampler.ids[r] for r in rows]
        else:
            rows = order = list(self.sampler)
        on_device = torch.tensor(rows, dtype=torch.long, device=dev)
        g = torch.Generator(device=dev)
        g.manual_seed(self.seed * 1_000_003 + self.sampler.epoch * 1009 + self.rank)
        for start in range(0, len(order), self.batch_size):
            with torch.profiler.record_function("yolo_ray.augment"):
                img, targets = augment_batch(self.cache, on_device[start : start + self.batch_size], self.hyp, g)
            files = [self.dataset.im_files[i] for i in order[start : start + self.batch_size]]
            yield {
                "img": img,
                **targets,
                "im_file": files,
                "ori_shape": [(self.cache.size, self.cache.size)] * len(files),
                "resized_shape": [(self.cache.size, self.cache.size)] * len(files),
            }

    def close_mosaic(self) -> None:
        self.hyp.mosaic = 0.0

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def decode_threads() -> int:
    """Threads to decode with: this node's CPUs shared among the Ray workers on it."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(32, cpus // max(1, local)))

"""The device loader's images: decoded once with Ultralytics' load_image (long side = imgsz) into uint8 slots on the
training device, with their labels as padded pixel tensors; replicated on every rank or sharded across them (a
rank's images and its sampler); whether a replicated copy fits."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch

from yolo_ray.data.image_decode import PAD


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

    def held_bytes(self) -> int:
        """What it holds on its device: the images, their sizes and labels."""
        held = (self.images, self.hw, self.boxes, self.cls, self.valid, self.keypoints)
        return sum(t.nbytes for t in held if t is not None)

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


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def fits(n: int, imgsz: int, device: torch.device) -> bool:
    """Would n decoded images fit in this device's share for the cache?"""
    return DeviceCache.nbytes(n, imgsz) <= CACHE_SHARE * free_bytes(device)


def _check_fits(n: int, imgsz: int, device: torch.device, sharded: bool = False) -> None:
    if not fits(n, imgsz, device):
        need, free = DeviceCache.nbytes(n, imgsz), free_bytes(device)
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


# --------------------------------------------------------------------------------------------------- loader

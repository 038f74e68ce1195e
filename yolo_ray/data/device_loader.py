"""A training loader that keeps the decoded images on the training device and augments whole batches there.

Ultralytics decodes and augments each image on the CPU (mosaic, random affine, HSV, flips). On an H200 host that
feeds YOLO11n about 1000 images/s per 32 cores while the training step alone runs twice as fast. This loader decodes
every image once, with Ultralytics' own `load_image` (long side = imgsz), keeps the images as uint8 on the device,
and augments a whole batch there, moving the boxes (and a pose dataset's keypoints) with the image (random parameters
and labels as batched tensor ops; the pixels in one fused Triton kernel on CUDA, augment_kernel.py, or as torch ops,
the reference, on CPU; device_augment.py):

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
from torch.utils.data import DistributedSampler

from yolo_ray.data.device_augment import PAD, augment_batch


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

    @classmethod
    def build(
        cls, dataset: Any, args: Any, device: torch.device, batch_size: int, rank: int, world_size: int, sharded: bool
    ) -> DeviceLoader:
        """This rank's loader as the worker's plan asks for it: Ultralytics' train dataset decoded into a replicated
        cache (every image) or a sharded one (this rank's), augmented with the train args' hyperparameters."""
        ids = shard_ids(len(dataset), rank, world_size, args.seed) if sharded else None
        cache = DeviceCache.build(dataset, args.imgsz, device, decode_threads(), ids=ids)
        return cls(dataset, cache, batch_size, rank, world_size, AugmentHyp.from_args(args), args.seed)

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

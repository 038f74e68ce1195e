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

import math
import os
from typing import Any

import torch
from torch.utils.data import DistributedSampler

from yolo_ray.data.device_augment import AugmentHyp, augment_batch
from yolo_ray.data.device_cache import DeviceCache, ShardSampler, shard_ids


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

    def data_device_bytes(self) -> int:
        """Training data held on the device (metrics' data_device_peak_gib): the whole cache, all the time."""
        return self.cache.held_bytes()

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

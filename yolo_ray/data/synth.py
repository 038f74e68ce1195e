"""Generated, learnable detection datasets in YOLO format, in two styles.

`shapes`: coloured shapes on textured backgrounds, square images with 1-4 large, well-separated objects. Each class
is a shape (circle, square, triangle, ...); backgrounds are smooth colour noise with stripes so the detector must
learn shape, not colour or contrast alone. Quick to learn: for tests of mechanics.

`real` (scenes.py): the same classes in scenes shaped like real data (many image sizes and aspect ratios, 0-15
objects of log-uniform size, occlusion, clutter, empty, grey and PNG images): what learning and parity are judged on.

Images are written in parallel, one seed per image, so a dataset is reproducible whatever the number of processes.
"""

from __future__ import annotations

import math
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import yaml

from yolo_ray.data.shape_drawing import SHAPES, background, draw, tight_box
from yolo_ray.data.synth_spec import SynthSpec

__all__ = ["SynthSpec", "dataset_path", "ensure", "generate", "make_image"]  # SynthSpec: where callers import it


def make_image(
    spec: SynthSpec, index: int, split_seed: int
) -> tuple[np.ndarray, list[tuple[int, float, float, float, float]]]:
    """One image and its YOLO labels (class, cx, cy, w, h normalised); deterministic in (seed, split, index)."""
    if spec.style == "real":
        from yolo_ray.data.scenes import make_scene

        return make_scene(index, split_seed, spec.seed, spec.imgsz, spec.classes, spec.objects_limit)
    rng = np.random.default_rng([spec.seed, split_seed, index])
    size = spec.imgsz
    img = background(rng, size)
    labels: list[tuple[int, float, float, float, float]] = []
    placed: list[tuple[float, float, float]] = []
    for _ in range(int(rng.integers(1, spec.objects_limit + 1))):
        for _attempt in range(20):  # keep objects apart so every one is visible
            r = float(rng.uniform(0.08, 0.2) * size)
            cx, cy = (float(v) for v in rng.uniform(r + 1, size - r - 1, 2))
            if all(math.hypot(cx - px, cy - py) > (r + pr) * 1.05 for px, py, pr in placed):
                break
        else:
            continue
        cls = int(rng.integers(0, spec.classes))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        draw(img, SHAPES[cls], cx, cy, r, colour)
        x1, y1, x2, y2 = (min(max(v, 0.0), size - 1.0) for v in tight_box(SHAPES[cls], cx, cy, r))
        placed.append((cx, cy, r))
        labels.append((cls, (x1 + x2) / 2 / size, (y1 + y2) / 2 / size, (x2 - x1) / size, (y2 - y1) / size))
    return img, labels


def _write_chunk(args: tuple[SynthSpec, str, int, int, int]) -> int:
    spec, split_dir, split_seed, start, stop = args
    root = Path(split_dir)
    if spec.task != "detect":
        from yolo_ray.data import task_synth

        if spec.task == "classify":
            task_synth.write_classify(root, spec, split_seed, start, stop)
            return stop - start
        for i in range(start, stop):
            img, rows = task_synth.make_image(spec, i, split_seed)
            cv2.imwrite(str(root / "images" / f"{i:06d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 92])
            (root / "labels" / f"{i:06d}.txt").write_text("".join(f"{r}\n" for r in rows))
        return stop - start
    for i in range(start, stop):
        img, labels = make_image(spec, i, split_seed)
        suffix, params = ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 92]
        if spec.style == "real":
            from yolo_ray.data.scenes import encoding

            suffix, params = encoding(i, split_seed, spec.seed)
        cv2.imwrite(str(root / "images" / f"{i:06d}{suffix}"), img, params)
        lines = "".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in labels)
        (root / "labels" / f"{i:06d}.txt").write_text(lines)
    return stop - start


def generate(out_dir: str | os.PathLike, spec: SynthSpec, processes: int | None = None) -> Path:
    """Write train/ and val/ splits and data.yaml under out_dir; returns the data.yaml path."""
    spec.validate()
    out = Path(out_dir).resolve()
    processes = processes or min(32, os.cpu_count() or 1)
    jobs = []
    subdirs = ("images", "labels")
    if spec.task == "classify":  # Ultralytics' classification layout: a folder per class
        from yolo_ray.data.task_synth import class_names

        subdirs = tuple(class_names("classify", spec.classes).values())
    for split, count, split_seed in (("train", spec.images, 1), ("val", spec.val_images, 2)):
        for sub in subdirs:
            (out / split / sub).mkdir(parents=True, exist_ok=True)
        chunk = max(1, math.ceil(count / (processes * 4)))
        jobs += [(spec, str(out / split), split_seed, s, min(s + chunk, count)) for s in range(0, count, chunk)]
    if processes > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(processes) as pool:
            list(pool.map(_write_chunk, jobs))
    else:
        for job in jobs:
            _write_chunk(job)
    data_yaml = out / "data.yaml"
    data = {
        "path": str(out),
        "train": "train/images",
        "val": "val/images",
        "names": {i: SHAPES[i] for i in range(spec.classes)},
        "synthetic": spec.record(),
    }
    if spec.task != "detect":
        from yolo_ray.data import task_synth

        data["names"] = task_synth.class_names(spec.task, spec.classes)
        if spec.task == "pose":
            data.update(kpt_shape=task_synth.KPT_SHAPE, flip_idx=task_synth.FLIP_IDX)
        if spec.task == "classify":  # the dataset is the folder (data.yaml only records the spec, for ensure())
            data.update(train="train", val="val")
    data_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    return data_yaml


def ensure(out_dir: str | os.PathLike, spec: SynthSpec) -> Path:
    """Generate once: reuse out_dir when its data.yaml records the same spec (safe to call from every run)."""
    data_yaml = Path(out_dir).resolve() / "data.yaml"
    if data_yaml.exists():
        have = (yaml.safe_load(data_yaml.read_text()) or {}).get("synthetic")
        if have == spec.record():
            return data_yaml
        if isinstance(have, dict):  # a set this module generated with another spec: no stale images left in
            for split in ("train", "val"):
                shutil.rmtree(data_yaml.parent / split, ignore_errors=True)
    return generate(out_dir, spec)


def dataset_path(data_yaml: Path, task: str) -> Path:
    """What a run's data.path is for a generated set: its data.yaml, or for classify its folder (Ultralytics'
    classification datasets are folders)."""
    return data_yaml.parent if task == "classify" else data_yaml

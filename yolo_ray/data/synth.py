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
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml

SHAPES = ("circle", "square", "triangle", "cross", "diamond", "hexagon", "star", "ring")
STYLES = ("shapes", "real")


@dataclass(frozen=True)
class SynthSpec:
    """What to generate; `images` is the train split size, val gets a fifth of it (at least 8). imgsz: the square
    side (shapes) or the scale of the image sizes (real: 320x240 to 1280x720 at 640). max_objects: 0 is the style's
    own (4 for shapes, 15 for real)."""

    images: int = 256
    imgsz: int = 128
    classes: int = 3
    seed: int = 0
    max_objects: int = 0
    style: str = "shapes"
    task: str = "detect"  # detect, or segment / obb / pose / classify (task_synth.py: shapes style only)

    @property
    def val_images(self) -> int:
        return max(8, self.images // 5)

    @property
    def objects_limit(self) -> int:
        return self.max_objects or (15 if self.style == "real" else 4)

    def record(self) -> dict:
        """What data.yaml records of the spec, to tell whether a generated set is the one asked for."""
        out = {"images": self.images, "imgsz": self.imgsz, "classes": self.classes, "seed": self.seed}
        if self.style != "shapes" or self.max_objects:  # sets generated before styles existed stay valid
            out.update(style=self.style, max_objects=self.objects_limit)
        if self.task != "detect":
            out["task"] = self.task
        return out

    def validate(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if not 1 <= self.classes <= len(SHAPES):
            raise ValueError(f"classes must be between 1 and {len(SHAPES)} (one per shape), got {self.classes}")
        if self.task != "detect":
            from yolo_ray.data.task_synth import MAX_CLASSES

            if self.task not in MAX_CLASSES or self.style != "shapes":
                raise ValueError(f"task {self.task!r}: one of {', '.join(MAX_CLASSES)}, in the shapes style")
            if self.classes > MAX_CLASSES[self.task]:
                raise ValueError(f"task {self.task}: classes must be at most {MAX_CLASSES[self.task]}")
        if self.images < 1 or self.imgsz < 32 or self.max_objects < 0:
            raise ValueError("images >= 1, imgsz >= 32 and max_objects >= 0 are required")


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    cells = int(rng.integers(3, 9))
    noise = rng.integers(40, 216, size=(cells, cells, 3), dtype=np.uint8)
    img = cv2.resize(noise, (size, size), interpolation=cv2.INTER_CUBIC)
    for _ in range(int(rng.integers(2, 6))):  # stripes: edges that are not objects
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        p1 = tuple(int(v) for v in rng.integers(0, size, 2))
        p2 = tuple(int(v) for v in rng.integers(0, size, 2))
        cv2.line(img, p1, p2, colour, int(rng.integers(1, max(2, size // 64) + 1)))
    return img


# the shapes drawn as polygons: (corners, phase, inner radius of a star's notches)
POLYGONS = {
    "triangle": (3, -math.pi / 2, None),
    "diamond": (4, 0.0, None),
    "hexagon": (6, 0.0, None),
    "star": (5, -math.pi / 2, 0.45),
}


def polygon_points(cx: float, cy: float, r: float, n: int, phase: float, inner: float | None = None) -> np.ndarray:
    pts = []
    steps = n * 2 if inner else n
    for i in range(steps):
        rad = r if (inner is None or i % 2 == 0) else r * inner
        a = phase + 2 * math.pi * i / steps
        pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
    return np.array(pts)


def _polygon(cx: float, cy: float, r: float, n: int, phase: float, inner: float | None = None) -> np.ndarray:
    return np.round(polygon_points(cx, cy, r, n, phase, inner)).astype(np.int32)


def _draw(img: np.ndarray, shape: str, cx: float, cy: float, r: float, colour: tuple[int, ...]) -> None:
    c, ri = (int(round(cx)), int(round(cy))), int(round(r))
    if shape == "circle":
        cv2.circle(img, c, ri, colour, -1, cv2.LINE_AA)
    elif shape == "ring":
        cv2.circle(img, c, ri, colour, max(2, ri // 3), cv2.LINE_AA)
    elif shape == "square":
        cv2.rectangle(img, (c[0] - ri, c[1] - ri), (c[0] + ri, c[1] + ri), colour, -1)
    elif shape == "cross":
        w = max(2, ri // 3)
        cv2.rectangle(img, (c[0] - ri, c[1] - w), (c[0] + ri, c[1] + w), colour, -1)
        cv2.rectangle(img, (c[0] - w, c[1] - ri), (c[0] + w, c[1] + ri), colour, -1)
    else:
        cv2.fillPoly(img, [_polygon(cx, cy, r, *POLYGONS[shape])], colour, cv2.LINE_AA)


def _box(shape: str, cx: float, cy: float, r: float) -> tuple[float, float, float, float]:
    """Tight box (x1, y1, x2, y2) of a drawn shape."""
    if shape in ("triangle", "star"):
        n, inner = (3, None) if shape == "triangle" else (5, 0.45)
        pts = _polygon(cx, cy, r, n, -math.pi / 2, inner)
        return float(pts[:, 0].min()), float(pts[:, 1].min()), float(pts[:, 0].max()), float(pts[:, 1].max())
    return cx - r, cy - r, cx + r, cy + r


def make_image(
    spec: SynthSpec, index: int, split_seed: int
) -> tuple[np.ndarray, list[tuple[int, float, float, float, float]]]:
    """One image and its YOLO labels (class, cx, cy, w, h normalised); deterministic in (seed, split, index)."""
    if spec.style == "real":
        from yolo_ray.data.scenes import make_scene

        return make_scene(index, split_seed, spec.seed, spec.imgsz, spec.classes, spec.objects_limit)
    rng = np.random.default_rng([spec.seed, split_seed, index])
    size = spec.imgsz
    img = _background(rng, size)
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
        _draw(img, SHAPES[cls], cx, cy, r, colour)
        x1, y1, x2, y2 = (min(max(v, 0.0), size - 1.0) for v in _box(SHAPES[cls], cx, cy, r))
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

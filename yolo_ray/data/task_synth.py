"""Generated datasets for the tasks beside detection, from the shapes of synth.py: learnable in minutes on a CPU.

- segment: every shape as a polygon, drawn from the polygon its label holds (the mask is exactly the label);
- obb: elongated shapes at any angle, labelled with the rotated rectangle around them (cv2.minAreaRect);
- pose: quadrilaterals (square, rectangle, trapezoid) turned by up to 30 degrees, their four corners as keypoints
  in a fixed order (top-left, top-right, bottom-right, bottom-left before the turn), so a horizontal flip swaps
  them pairwise (flip_idx [1, 0, 3, 2]);
- classify: one shape per image, in a folder per class (Ultralytics' classification layout).

Deterministic in (seed, split, index), as synth.py's.
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np

from yolo_ray.data import shape_drawing
from yolo_ray.data.shape_drawing import QUADS
from yolo_ray.data.synth_spec import SynthSpec

KPT_SHAPE = [4, 3]  # four corners, (x, y, visible)
FLIP_IDX = [1, 0, 3, 2]


def class_names(task: str, classes: int) -> dict[int, str]:
    return {i: (QUADS if task == "pose" else shape_drawing.SHAPES)[i] for i in range(classes)}


def outline(shape: str, cx: float, cy: float, r: float, angle: float = 0.0, aspect: float = 1.0) -> np.ndarray:
    """A shape's polygon (float x, y rows): stretched `aspect` times along x, then turned by `angle` radians."""
    unit = {
        "circle": [(math.cos(a), math.sin(a)) for a in np.linspace(0, 2 * math.pi, 32, endpoint=False)],
        "square": [(-1, -1), (1, -1), (1, 1), (-1, 1)],
        "rectangle": [(-1, -0.5), (1, -0.5), (1, 0.5), (-1, 0.5)],
        "trapezoid": [(-0.6, -0.7), (0.6, -0.7), (1, 0.7), (-1, 0.7)],
        "cross": [
            (-1, -0.33), (-0.33, -0.33), (-0.33, -1), (0.33, -1), (0.33, -0.33), (1, -0.33),
            (1, 0.33), (0.33, 0.33), (0.33, 1), (-0.33, 1), (-0.33, 0.33), (-1, 0.33),
        ],
    }.get(shape)  # fmt: skip
    if unit is None:  # the regular polygons and the star of shape_drawing.py
        unit = shape_drawing.polygon_points(0.0, 0.0, 1.0, *shape_drawing.POLYGONS[shape])
    pts = np.asarray(unit, np.float64) * r
    pts[:, 0] *= aspect
    c, s = math.cos(angle), math.sin(angle)
    return pts @ np.array([[c, s], [-s, c]]) + (cx, cy)


def _place(rng: np.random.Generator, size: int, reach: float, placed: list[tuple[float, float, float]]) -> tuple:
    """A centre `reach` px inside the image and apart from the objects placed, or None."""
    if reach >= size / 2 - 1:
        return None
    for _ in range(20):
        cx, cy = (float(v) for v in rng.uniform(reach + 1, size - reach - 1, 2))
        if all(math.hypot(cx - px, cy - py) > (reach + pr) * 1.05 for px, py, pr in placed):
            placed.append((cx, cy, reach))
            return cx, cy
    return None


def _fill(img: np.ndarray, pts: np.ndarray, rng: np.random.Generator) -> None:
    colour = tuple(int(c) for c in rng.integers(0, 256, 3))
    cv2.fillPoly(img, [np.round(pts).astype(np.int32)], colour, cv2.LINE_AA)


def _norm(pts: np.ndarray, size: int) -> str:
    return " ".join(f"{min(max(v / size, 0.0), 1.0):.6f}" for v in pts.reshape(-1))


def make_image(spec: SynthSpec, index: int, split_seed: int) -> tuple[np.ndarray, list[str]]:
    """One image of a detection-style task (segment, obb, pose) and its label rows."""
    rng = np.random.default_rng([spec.seed, split_seed, index])
    size = spec.imgsz
    img = shape_drawing.background(rng, size)
    rows: list[str] = []
    placed: list[tuple[float, float, float]] = []
    for _ in range(int(rng.integers(1, spec.objects_limit + 1))):
        cls = int(rng.integers(0, spec.classes))
        r = float(rng.uniform(0.08, 0.18) * size)
        if spec.task == "segment":
            angle, aspect = float(rng.uniform(0, 2 * math.pi)), 1.0
        elif spec.task == "obb":
            angle, aspect = float(rng.uniform(0, math.pi)), float(rng.uniform(1.6, 2.4))
            r /= aspect**0.5  # the same area as the other tasks' shapes
        else:  # pose
            angle, aspect = float(rng.uniform(-math.pi / 6, math.pi / 6)), 1.0
        shape = (QUADS if spec.task == "pose" else shape_drawing.SHAPES)[cls]
        pts = outline(shape, 0.0, 0.0, r, angle, aspect)
        centre = _place(rng, size, float(np.hypot(*pts.T).max()) * 1.05, placed)
        if centre is None:
            continue
        pts += centre
        _fill(img, pts, rng)
        if spec.task == "segment":
            rows.append(f"{cls} {_norm(pts, size)}")
        elif spec.task == "obb":
            rows.append(f"{cls} {_norm(cv2.boxPoints(cv2.minAreaRect(pts.astype(np.float32))), size)}")
        else:
            (x1, y1), (x2, y2) = pts.min(0), pts.max(0)
            box = np.array([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1])
            kpts = " ".join(f"{x / size:.6f} {y / size:.6f} 2" for x, y in pts)
            rows.append(f"{cls} {_norm(box, size)} {kpts}")
    return img, rows


def make_classify_image(spec: SynthSpec, index: int, split_seed: int) -> tuple[np.ndarray, int]:
    """One large shape near the middle, at any angle, on a smooth background (Ultralytics' classification
    augmentation, RandAugment and random erasing, is heavy: on synth.py's striped backgrounds YOLO11n-cls stayed at
    chance for 10 epochs, native as much as yolo_ray); and its class."""
    rng = np.random.default_rng([spec.seed, split_seed, index])
    size = spec.imgsz
    cells = rng.integers(60, 140, size=(3, 3, 3), dtype=np.uint8)
    img = cv2.resize(cells, (size, size), interpolation=cv2.INTER_CUBIC)
    cls = int(rng.integers(0, spec.classes))
    r = float(rng.uniform(0.28, 0.4) * size)
    cx, cy = (float(v) for v in rng.uniform(r + 1, size - r - 1, 2))
    if shape_drawing.SHAPES[cls] == "ring":
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        cv2.circle(img, (round(cx), round(cy)), round(r), colour, max(2, round(r / 3)), cv2.LINE_AA)
    else:
        colour = tuple(int(c) for c in rng.choice([rng.integers(0, 50, 3), rng.integers(190, 256, 3)]))
        pts = outline(shape_drawing.SHAPES[cls], cx, cy, r, float(rng.uniform(0, 2 * math.pi)))
        cv2.fillPoly(img, [np.round(pts).astype(np.int32)], colour, cv2.LINE_AA)  # dark or light: never the background
    return img, cls


def write_classify(root: Path, spec: SynthSpec, split_seed: int, start: int, stop: int) -> None:
    names = class_names("classify", spec.classes)
    for i in range(start, stop):
        img, cls = make_classify_image(spec, i, split_seed)
        cv2.imwrite(str(root / names[cls] / f"{i:06d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 92])

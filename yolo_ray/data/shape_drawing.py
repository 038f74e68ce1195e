"""The shapes every generated dataset draws (synth.py's shapes style, scenes.py's real style, task_synth.py's tasks):
their names (a class is a shape), outlines, drawing and tight boxes, and the shapes style's background."""

from __future__ import annotations

import math

import cv2
import numpy as np

SHAPES = ("circle", "square", "triangle", "cross", "diamond", "hexagon", "star", "ring")
POLYGON_SHAPES = SHAPES[:7]  # a ring's hole has no polygon
QUADS = ("square", "rectangle", "trapezoid")  # the pose task's shapes
TASK_MAX_CLASSES = {"segment": len(POLYGON_SHAPES), "obb": len(POLYGON_SHAPES), "pose": len(QUADS), "classify": 8}


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A square of smooth colour noise crossed by stripes: edges that are not objects."""
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


def draw(img: np.ndarray, shape: str, cx: float, cy: float, r: float, colour: tuple[int, ...]) -> None:
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


def tight_box(shape: str, cx: float, cy: float, r: float) -> tuple[float, float, float, float]:
    """Tight box (x1, y1, x2, y2) of a drawn shape."""
    if shape in ("triangle", "star"):  # pointed up: narrower than their circle
        pts = _polygon(cx, cy, r, *POLYGONS[shape])
        return float(pts[:, 0].min()), float(pts[:, 1].min()), float(pts[:, 0].max()), float(pts[:, 1].max())
    return cx - r, cy - r, cx + r, cy + r

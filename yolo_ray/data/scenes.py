"""Generated images shaped like real detection data (`yolo-ray data synth OUT style=real`).

The shapes set (synth.py) is square, with 1-4 large, well-separated objects: every pipeline saturates it (native
YOLO11n reaches mAP50-95 ~0.99 in a few epochs), so a subtly broken one scores as a good one. These scenes have
what COCO, a factory camera or drone imagery have and the shapes set lacks:

- nine image sizes, 320x240 to 1280x720 at imgsz 640 (portrait, 4:3, 16:9; scaled with imgsz);
- 0-15 objects an image, log-uniformly many, ~6% of images empty; sizes log-uniform from ~1.5% to ~40% of the short
  side, so many objects are small (COCO's "small" is under 32x32 px at 640);
- partial occlusion: objects overlap and foreground bars cross them; a box is the object's visible extent, and an
  object less than a quarter visible is not labelled (as annotators skip it);
- clutter that is not an object: shapes of the unused kinds, irregular polygons, ellipses, lines, text;
- varied objects: rotated, stretched, two-tone, outlined or not; images blurred, noisy, unevenly lit;
- ~10% greyscale and ~10% PNG (the rest JPEG at quality 70-95).

Every image depends only on (seed, split, index): reproducible whatever the number of processes.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from yolo_ray.data.shape_drawing import SHAPES

# (w, h) at imgsz 640: the mix of a real collection (phone, webcam, HD, portrait)
SIZES_640 = ((320, 240), (480, 360), (640, 480), (800, 600), (1024, 768), (1280, 720), (960, 540), (480, 640),
             (720, 1280))  # fmt: skip
EMPTY_P, GREY_P, PNG_P = 0.06, 0.10, 0.10
MIN_SIDE, MAX_SIDE = 0.015, 0.40  # object size range as a fraction of the image's short side (log-uniform)
MIN_VISIBLE = 0.25  # an object less visible than this is left unlabelled
MIN_PIXELS = 4  # no object smaller than this on its long side, whatever the scale

Label = tuple[int, float, float, float, float]


def image_size(rng: np.random.Generator, imgsz: int) -> tuple[int, int]:
    w, h = SIZES_640[int(rng.integers(len(SIZES_640)))]
    k = imgsz / 640
    return max(32, round(w * k)), max(32, round(h * k))


def _background(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    cells = int(rng.integers(2, 10))
    noise = rng.integers(30, 226, size=(cells, max(2, round(cells * w / h)), 3), dtype=np.uint8)
    img = cv2.resize(noise, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    if rng.random() < 0.5:  # fine texture: carpet, asphalt, foliage
        grain = cv2.resize(rng.normal(0, 1, (h // 4 + 1, w // 4 + 1)).astype(np.float32), (w, h))
        img += grain[..., None] * float(rng.uniform(4, 18))
    return img


def _lighting(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    """A brightness ramp across the image and a global contrast change: uneven light, as from a window."""
    h, w = img.shape[:2]
    a = rng.uniform(0, 2 * math.pi)
    ramp = (np.cos(a) * np.linspace(-1, 1, w)[None, :] + np.sin(a) * np.linspace(-1, 1, h)[:, None]).astype(np.float32)
    img = img * (1 + float(rng.uniform(0, 0.35)) * ramp[..., None])
    mean = img.mean()
    return (img - mean) * float(rng.uniform(0.7, 1.2)) + mean + float(rng.uniform(-25, 25))


def _shape_mask(kind: str, d: int, rng: np.random.Generator) -> np.ndarray:
    """An anti-aliased mask (float 0..1) of one shape, about d pixels across, rotated and stretched at random."""
    pad = 2
    size = d + 2 * pad
    m = np.zeros((size * 2, size * 2), np.uint8)  # drawn at 2x, then downsampled: smooth edges at any size
    c, r = size, d  # centre and radius at 2x
    phase = float(rng.uniform(0, 2 * math.pi))
    if kind == "circle":
        cv2.circle(m, (c, c), r, 255, -1, cv2.LINE_AA)
    elif kind == "ring":
        cv2.circle(m, (c, c), r, 255, max(2, r // 3), cv2.LINE_AA)
    elif kind == "cross":
        arm = max(2, r // 3)
        pts = [(-r, -arm), (r, -arm), (r, arm), (-r, arm)]
        for rot in (0.0, math.pi / 2):
            cv2.fillPoly(m, [_rotated(pts, c, phase + rot)], 255, cv2.LINE_AA)
    elif kind == "square":
        cv2.fillPoly(m, [_rotated([(-r, -r), (r, -r), (r, r), (-r, r)], c, phase * 0.15)], 255, cv2.LINE_AA)
    else:
        n, inner = {"triangle": (3, None), "diamond": (4, None), "hexagon": (6, None), "star": (5, 0.45)}[kind]
        steps = n * 2 if inner else n
        radii = [r if inner is None or i % 2 == 0 else r * inner for i in range(steps)]  # a star's points alternate
        pts = [
            (rad * math.cos(2 * math.pi * i / steps), rad * math.sin(2 * math.pi * i / steps))
            for i, rad in enumerate(radii)
        ]
        cv2.fillPoly(m, [_rotated(pts, c, phase)], 255, cv2.LINE_AA)
    sx, sy = (float(v) for v in rng.uniform(0.75, 1.25, 2))  # stretched: no two instances alike
    out = cv2.resize(m, (max(3, round(size * sx)), max(3, round(size * sy))), interpolation=cv2.INTER_AREA)
    return out.astype(np.float32) / 255


def _rotated(pts: list[tuple[float, float]], c: int, a: float) -> np.ndarray:
    ca, sa = math.cos(a), math.sin(a)
    return np.round([(c + x * ca - y * sa, c + x * sa + y * ca) for x, y in pts]).astype(np.int32)


def _paint(
    img: np.ndarray, ids: np.ndarray, mask: np.ndarray, x0: int, y0: int, colour: np.ndarray, oid: int, rng: Any
) -> tuple[int, int, int, int, int]:
    """Composite a mask at (x0, y0) in a colour with a shading gradient and maybe an outline; mark its pixels oid.
    Returns (pixels marked, x1, y1, x2, y2 of the part inside the image)."""
    h, w = mask.shape
    H, W = ids.shape
    xa, ya, xb, yb = max(0, x0), max(0, y0), min(W, x0 + w), min(H, y0 + h)
    if xa >= xb or ya >= yb:
        return 0, 0, 0, 0, 0
    m = mask[ya - y0 : yb - y0, xa - x0 : xb - x0]
    shade = np.linspace(1 - rng.uniform(0, 0.4), 1, m.shape[0], dtype=np.float32)[:, None, None]
    fill = colour[None, None, :] * shade
    if rng.random() < 0.4 and min(m.shape) > 6:  # a darker rim
        rim = m - cv2.erode(m, np.ones((3, 3), np.uint8))
        fill = fill * (1 - 0.5 * rim[..., None])
    a = m[..., None]
    region = img[ya:yb, xa:xb]
    region[:] = region * (1 - a) + fill * a
    solid = m >= 0.5
    ids[ya:yb, xa:xb][solid] = oid
    return int(solid.sum()), xa, ya, xb, yb


def _clutter(rng: np.random.Generator, img: np.ndarray, ids: np.ndarray | None, classes: int, short: int) -> None:
    """Things that are not objects: other shapes, blobs, ellipses, lines, text. With ids, they occlude objects."""
    h, w = img.shape[:2]
    colour = rng.integers(0, 256, 3).astype(np.float32)
    kind = int(rng.integers(5 if classes < len(SHAPES) else 4))
    if kind == 4:  # a shape of a kind no class uses: looks like an object, is not one
        d = max(MIN_PIXELS, int(short * math.exp(rng.uniform(math.log(MIN_SIDE), math.log(MAX_SIDE)))))
        mask = _shape_mask(SHAPES[int(rng.integers(classes, len(SHAPES)))], d, rng)
        scratch = np.zeros((h, w), np.int32) if ids is None else ids
        _paint(img, scratch, mask, int(rng.integers(-d // 2, w)), int(rng.integers(-d // 2, h)), colour, 0, rng)
        return
    layer = np.zeros((h, w), np.uint8)
    if kind == 0:  # a thick bar across the scene: a pole, a cable, a shelf edge
        p1 = (int(rng.integers(-w // 4, w + w // 4)), int(rng.integers(-h // 4, h + h // 4)))
        p2 = (int(rng.integers(-w // 4, w + w // 4)), int(rng.integers(-h // 4, h + h // 4)))
        cv2.line(layer, p1, p2, 255, max(1, int(short * rng.uniform(0.004, 0.03))), cv2.LINE_AA)
    elif kind == 1:  # an ellipse
        axes = tuple(max(1, int(short * v)) for v in rng.uniform(0.01, 0.15, 2))
        centre = (int(rng.integers(w)), int(rng.integers(h)))
        cv2.ellipse(layer, centre, axes, float(rng.uniform(0, 180)), 0, 360, 255, -1, cv2.LINE_AA)
    elif kind == 2:  # an irregular polygon
        n, r = int(rng.integers(5, 10)), short * rng.uniform(0.01, 0.12)
        cx, cy = rng.integers(w), rng.integers(h)
        angles = np.sort(rng.uniform(0, 2 * math.pi, n))
        radii = r * rng.uniform(0.4, 1.0, n)
        pts = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1).round().astype(np.int32)
        cv2.fillPoly(layer, [pts], 255, cv2.LINE_AA)
    else:  # text, as on signs and labels
        text = "".join(chr(int(c)) for c in rng.integers(65, 91, int(rng.integers(2, 8))))
        scale = short * rng.uniform(0.0015, 0.006)
        org = (int(rng.integers(w)), int(rng.integers(h)))
        cv2.putText(layer, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, 255, max(1, int(scale * 2)), cv2.LINE_AA)
    a = layer.astype(np.float32)[..., None] / 255
    img[:] = img * (1 - a) + colour * a
    if ids is not None:
        ids[layer >= 128] = 0


def make_scene(
    index: int, split_seed: int, seed: int, imgsz: int, classes: int, max_objects: int
) -> tuple[np.ndarray, list[Label]]:
    """One scene (uint8 HxWx3 BGR, or HxW when grey) and its YOLO labels; deterministic in (seed, split, index)."""
    rng = np.random.default_rng([seed, split_seed, index, 20])
    w, h = image_size(rng, imgsz)
    short = min(w, h)
    img = _background(rng, w, h)
    for _ in range(int(rng.integers(0, 7))):  # background clutter, under the objects
        _clutter(rng, img, None, classes, short)
    ids = np.zeros((h, w), np.int32)
    n = 0 if rng.random() < EMPTY_P else int(math.exp(rng.uniform(0, math.log(max_objects + 1))))
    objects: list[tuple[int, int, int, int, int, int]] = []  # (class, pixels painted, x1, y1, x2, y2) per object
    for oid in range(1, n + 1):
        cls = int(rng.integers(classes))
        d = max(MIN_PIXELS, int(short * math.exp(rng.uniform(math.log(MIN_SIDE), math.log(MAX_SIDE)))))
        mask = _shape_mask(SHAPES[cls], d, rng)
        mh, mw = mask.shape
        x0, y0 = int(rng.integers(-mw // 3, w - 2 * mw // 3)), int(rng.integers(-mh // 3, h - 2 * mh // 3))
        colour = rng.integers(0, 256, 3).astype(np.float32)
        objects.append((cls, *_paint(img, ids, mask, x0, y0, colour, oid, rng)))
    for _ in range(int(rng.integers(0, 3))):  # foreground clutter: occludes what is behind it
        _clutter(rng, img, ids, classes, short)
    labels = _visible_boxes(ids, objects, w, h)
    img = _finish(rng, img)
    if rng.random() < GREY_P:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    return img, labels


def _visible_boxes(ids: np.ndarray, objects: list[tuple[int, ...]], w: int, h: int) -> list[Label]:
    """Each object's box is its visible extent (cut by the border if need be); an object that others cover for
    more than 1 - MIN_VISIBLE of what it painted is not labelled."""
    labels: list[Label] = []
    for oid, (cls, painted, xa, ya, xb, yb) in enumerate(objects, 1):
        if not painted:
            continue
        ys, xs = np.nonzero(ids[ya:yb, xa:xb] == oid)
        if len(xs) < max(4, MIN_VISIBLE * painted):
            continue
        bx1, by1, bx2, by2 = xa + xs.min(), ya + ys.min(), xa + xs.max() + 1, ya + ys.max() + 1
        if bx2 - bx1 < 2 or by2 - by1 < 2:
            continue
        labels.append((cls, (bx1 + bx2) / 2 / w, (by1 + by2) / 2 / h, (bx2 - bx1) / w, (by2 - by1) / h))
    return labels


def _finish(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    """Camera effects: uneven light, focus blur, sensor noise; then uint8."""
    img = _lighting(rng, img)
    if rng.random() < 0.25:
        img = cv2.GaussianBlur(img, (0, 0), float(rng.uniform(0.5, 1.6)))
    if rng.random() < 0.5:
        img = img + rng.normal(0, float(rng.uniform(2, 9)), img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def encoding(index: int, split_seed: int, seed: int) -> tuple[str, list[int]]:
    """(suffix, cv2 params) for an image: ~10% PNG, else JPEG at a quality from 70 to 95."""
    rng = np.random.default_rng([seed, split_seed, index, 21])
    if rng.random() < PNG_P:
        return ".png", [cv2.IMWRITE_PNG_COMPRESSION, 1]
    return ".jpg", [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(70, 96))]

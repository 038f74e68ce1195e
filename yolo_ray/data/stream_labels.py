"""data.loader=stream: a YOLO label file's rows, parsed where Ray Data reads it (its CPU tasks) and carried to the rank
as packed float32 bytes; the rank turns a batch of them into one padded array with a few numpy calls. Parsing on the
rank's feed thread took 0.7 s of a 4.2 s epoch on an H100 (3000 images, batch 64), in Python that also held up the
training thread's kernel launches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROW = 5  # class, x, y, w, h (normalised)


def parse_labels(text: str) -> np.ndarray:
    """[k, 5] (class, x, y, w, h normalised) of a YOLO label file; polygon rows become their boxes and duplicate
    rows go, as Ultralytics' verify_image_label does for a detection dataset."""
    rows = []
    for line in text.splitlines():
        v = line.split()
        if len(v) < ROW:
            continue
        nums = [float(x) for x in v]
        if len(v) > ROW:  # a segment: its box
            xy = np.array(nums[1:], dtype=np.float32).reshape(-1, 2)
            lo, hi = xy.min(0), xy.max(0)
            nums = [nums[0], *((lo + hi) / 2), *(hi - lo)]
        rows.append(nums[:ROW])
    if not rows:
        return np.zeros((0, ROW), dtype=np.float32)
    return np.unique(np.array(rows, dtype=np.float32), axis=0)


def pack(text: str) -> bytes:
    """A label file's text as the bytes of its parsed [k, 5] float32 rows (Ray Data's column)."""
    return parse_labels(text).tobytes()


def unpack(packed: bytes) -> np.ndarray:
    return np.frombuffer(packed, dtype=np.float32).reshape(-1, ROW)


def label_batch(packed: Sequence[bytes], hw: np.ndarray) -> np.ndarray:
    """A batch's packed rows -> [B, k, 6] float32: box xyxy in pixels of each image at its (h, w), class, valid (1/0);
    k the batch's most boxes (at least 1). The same numbers as device_cache.label_tensors, without its loop."""
    rows = [unpack(p) for p in packed]
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    out = np.zeros((len(rows), max(1, int(counts.max(initial=0))), 6), dtype=np.float32)
    if counts.sum():
        flat = np.concatenate(rows)
        image = np.repeat(np.arange(len(rows)), counts)
        slot = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
        wh = np.asarray(hw, dtype=np.float32)[image][:, ::-1]
        xy, half = flat[:, 1:3] * wh, flat[:, 3:5] * wh / 2
        out[image, slot, :4] = np.concatenate([xy - half, xy + half], 1)
        out[image, slot, 4] = flat[:, 0]
        out[image, slot, 5] = 1
    return out

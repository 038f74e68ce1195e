"""One image's bytes -> RGB uint8 at long side imgsz, as Ultralytics' load_image makes it (OpenCV). Light on purpose:
numpy and OpenCV only, so the stream's decoding processes (decode_pool.py) start without importing torch."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import numpy as np

PAD = 114.0  # Ultralytics' border grey


def decode_into(slot: np.ndarray, data: bytes | memoryview, name: str) -> tuple[int, int]:
    """One image decoded and resized as load_image does it into an imgsz^2 slot (HWC, RGB), the rest of the slot
    PAD; returns its (h, w). Resized in BGR, as load_image does, then turned RGB by OpenCV straight into the slot:
    numpy's copy of a reversed-channel view (`im[..., ::-1]`) took a quarter of an image's time (3.3 against 4.4 ms an
    image on one core of this repo's machine, the same pixels: `python benchmarks/decode_probe.py DIR N --cpu-only`).
    Called in processes (Ray Data's tasks, decode_pool.py): in threads beside Python-heavy ones each GIL release
    costs a wait (decode_pool.py)."""
    import cv2

    im = resize_cpu(decode_bgr(data, name), slot.shape[0])
    h, w = im.shape[:2]
    view = slot[:h, :w]
    rgb = cv2.cvtColor(im, cv2.COLOR_BGR2RGB, dst=view)
    if rgb is not view:  # an OpenCV that would not write into a strided view gave an array of its own
        view[...] = rgb
    slot[h:] = int(PAD)
    slot[:h, w:] = int(PAD)
    return h, w


def decode_cpu(data: bytes | memoryview, name: str) -> np.ndarray:
    """RGB uint8 HWC, as Ultralytics' imread (cv2.imdecode, colour) then its BGR -> RGB (OpenCV's turn: see
    decode_into)."""
    import cv2

    return cv2.cvtColor(decode_bgr(data, name), cv2.COLOR_BGR2RGB)


def decode_bgr(data: bytes | memoryview, name: str) -> np.ndarray:
    """BGR uint8 HWC, as Ultralytics' imread (cv2.imdecode, colour)."""
    import cv2

    im = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if im is None:
        raise ValueError(f"data.loader=stream: {name} is not an image OpenCV can decode")
    return im


def resized_hw(h0: int, w0: int, imgsz: int) -> tuple[int, int]:
    """load_image's rect size: long side imgsz, ceil, never above imgsz."""
    r = imgsz / max(h0, w0)
    return (h0, w0) if r == 1 else (min(math.ceil(h0 * r), imgsz), min(math.ceil(w0 * r), imgsz))


def resize_cpu(im: np.ndarray, imgsz: int) -> np.ndarray:
    import cv2

    h, w = resized_hw(*im.shape[:2], imgsz)
    return im if (h, w) == im.shape[:2] else cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)


_SHARED: dict[str, Any] = {}  # in a decoding process: the pool's shared host batches


def attach(name: str, shape: tuple[int, ...], niceness: int = 0) -> None:
    """A decoding process's initializer (decode_pool.py): maps the pool's shared host batches. One process per CPU,
    so OpenCV runs single-threaded in it; at `niceness` it yields a CPU it shares to the training thread."""
    from multiprocessing import shared_memory

    import cv2

    cv2.setNumThreads(1)
    os.nice(niceness)
    shm = shared_memory.SharedMemory(name=name)  # the pool's owner unlinks it
    _SHARED.update(shm=shm, batches=np.ndarray(shape, np.uint8, buffer=shm.buf))


def decode_chunk(
    k: int, slots: list[int], source: str, spans: list[tuple[int, int]], names: list[str]
) -> list[tuple[int, int]]:
    """In a decoding process: the images at `spans` of shared input buffer `source` into shared batch k's slots;
    their (h, w)."""
    batch, data = _SHARED["batches"][k], _input(k, source)
    return [decode_into(batch[i], data[a:b], n) for i, (a, b), n in zip(slots, spans, names, strict=True)]


def _input(k: int, name: str) -> memoryview:
    """Shared input buffer k, mapped once (again when the pool replaced it with a larger one)."""
    from multiprocessing import shared_memory

    inputs = _SHARED.setdefault("inputs", {})
    if k not in inputs or inputs[k].name != name:
        if k in inputs:
            with contextlib.suppress(BufferError):
                inputs[k].close()
        inputs[k] = shared_memory.SharedMemory(name=name)
    return inputs[k].buf

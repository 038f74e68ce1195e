from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from yolo_ray.data.synth import SynthSpec, generate, make_image


def test_generation_is_deterministic_and_parallel_safe(tmp_path: Path) -> None:
    spec = SynthSpec(images=24, imgsz=64, classes=4, seed=3)
    a = generate(tmp_path / "a", spec, processes=2)
    b = generate(tmp_path / "b", spec, processes=1)
    for split in ("train", "val"):
        la = sorted((a.parent / split / "labels").glob("*.txt"))
        lb = sorted((b.parent / split / "labels").glob("*.txt"))
        assert [p.read_text() for p in la] == [p.read_text() for p in lb]
    assert len(list((a.parent / "train" / "images").glob("*.jpg"))) == 24
    assert len(list((a.parent / "val" / "images").glob("*.jpg"))) == spec.val_images
    data = yaml.safe_load(a.read_text())
    assert data["names"] == {0: "circle", 1: "square", 2: "triangle", 3: "cross"}


def test_labels_are_valid_yolo_boxes() -> None:
    spec = SynthSpec(images=1, imgsz=128, classes=8, seed=0)
    for i in range(50):
        img, labels = make_image(spec, i, 1)
        assert img.shape == (128, 128, 3) and img.dtype == np.uint8
        assert 1 <= len(labels) <= spec.max_objects
        for cls, x, y, w, h in labels:
            assert 0 <= cls < 8 and 0 < w <= 1 and 0 < h <= 1
            assert 0 <= x - w / 2 + 1e-6 and x + w / 2 <= 1 + 1e-6 and 0 <= y - h / 2 + 1e-6 and y + h / 2 <= 1 + 1e-6

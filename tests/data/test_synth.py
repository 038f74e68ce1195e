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
        assert 1 <= len(labels) <= spec.objects_limit == 4
        for cls, x, y, w, h in labels:
            assert 0 <= cls < 8 and 0 < w <= 1 and 0 < h <= 1
            assert 0 <= x - w / 2 + 1e-6 and x + w / 2 <= 1 + 1e-6 and 0 <= y - h / 2 + 1e-6 and y + h / 2 <= 1 + 1e-6


def test_real_style_is_shaped_like_real_data() -> None:
    """style=real: the nine image sizes (portrait, 4:3, 16:9), crowds and empty images, objects down to ~1.5% of the
    short side, ~10% grey images; every box inside its image; reproducible per (seed, split, index)."""
    spec = SynthSpec(images=1, imgsz=640, classes=5, seed=0, style="real")
    shapes, counts, sides, grey = set(), [], [], 0
    for i in range(150):
        img, labels = make_image(spec, i, 1)
        h, w = img.shape[:2]
        shapes.add((w, h))
        grey += img.ndim == 2
        counts.append(len(labels))
        for cls, x, y, bw, bh in labels:
            assert 0 <= cls < 5 and 0 < bw <= 1 and 0 < bh <= 1
            assert (
                0 <= x - bw / 2 + 1e-6 and x + bw / 2 <= 1 + 1e-6 and 0 <= y - bh / 2 + 1e-6 and y + bh / 2 <= 1 + 1e-6
            )
            sides.append(max(bw * w, bh * h) / min(w, h))
    assert len(shapes) == 9 and (320, 240) in shapes and (1280, 720) in shapes and (720, 1280) in shapes
    assert max(counts) >= 12 and 0.02 <= counts.count(0) / len(counts) <= 0.15 and np.mean(counts) >= 3
    assert np.quantile(sides, 0.1) < 0.04 and max(sides) > 0.3  # many small objects, some large
    assert 5 <= grey <= 30
    again, labels_again = make_image(spec, 7, 1)
    first, labels_first = make_image(spec, 7, 1)
    assert np.array_equal(again, first) and labels_again == labels_first


def test_real_style_writes_png_and_grey_files(tmp_path: Path) -> None:
    spec = SynthSpec(images=60, imgsz=128, classes=3, seed=1, style="real")
    data_yaml = generate(tmp_path, spec, processes=2)
    files = sorted((tmp_path / "train" / "images").iterdir())
    assert len(files) == 60 and {f.suffix for f in files} == {".jpg", ".png"}
    assert yaml.safe_load(data_yaml.read_text())["synthetic"]["style"] == "real"

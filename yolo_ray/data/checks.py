"""Dataset checks run on the driver before Ray starts: the data.yaml, its image folders, and label class ids."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from yolo_ray.config import ConfigError, ExperimentConfig
from yolo_ray.data import synth

IMAGE_SUFFIXES = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm", ".heic"}


def prepare(cfg: ExperimentConfig) -> Path:
    """The data.yaml to train on: generated for `synthetic`, else checked. Raises ConfigError on bad data."""
    if cfg.data.path == "synthetic":
        s = cfg.data.synthetic
        spec = synth.SynthSpec(images=s.images, imgsz=s.imgsz, classes=s.classes, seed=s.seed, style=s.style)
        return synth.ensure(cfg.data.dir, spec)
    data_yaml = Path(cfg.data.path).expanduser().resolve()
    check(data_yaml, cfg.source)
    return data_yaml


def _names(data: dict) -> dict[int, str] | None:
    names = data.get("names")
    if isinstance(names, list):
        return dict(enumerate(names))
    if isinstance(names, dict):
        return {int(k): str(v) for k, v in names.items()}
    if isinstance(data.get("nc"), int):
        return {i: str(i) for i in range(data["nc"])}
    return None


def dataset_root(data_yaml: Path, data: dict) -> Path:
    """Where a data.yaml's splits live: its `path:` (relative to the file), else the file's own folder."""
    root = Path(data.get("path") or data_yaml.parent)
    return root if root.is_absolute() else (data_yaml.parent / root).resolve()


def image_files(entry: str | list, root: Path) -> tuple[list[Path], list[Path]]:
    """(images, missing locations) for a split entry: a folder, a .txt list, or a list of those."""
    images: list[Path] = []
    missing: list[Path] = []
    for item in entry if isinstance(entry, list) else [entry]:
        p = Path(item)
        p = p if p.is_absolute() else root / p
        if p.is_dir():
            images += [f for f in p.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES]
        elif p.is_file() and p.suffix == ".txt":
            for line in p.read_text().splitlines():
                if line.strip():
                    f = Path(line.strip())
                    images.append(f if f.is_absolute() else p.parent / f)
        else:
            missing.append(p)
    return images, missing


def label_file(image: Path) -> Path:
    parts = list(image.parts)
    for i in range(len(parts) - 1, -1, -1):  # Ultralytics' rule: the last /images/ becomes /labels/
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def _bad_class(label: Path, nc: int) -> tuple[Path, int, int] | None:
    """(file, line number, class id) of the first class id outside 0..nc-1, if any."""
    if not label.is_file():
        return None  # an image without labels is a background image
    for n, line in enumerate(label.read_text().splitlines(), 1):
        fields = line.split()
        if fields:
            try:
                cls = int(float(fields[0]))
            except ValueError:
                return label, n, -1
            if not 0 <= cls < nc:
                return label, n, cls
    return None


def check(data_yaml: Path, source: str) -> None:
    if not data_yaml.is_file():
        raise ConfigError(
            source,
            "data.path",
            f"dataset file {data_yaml} does not exist.",
            "point data.path at a YOLO data.yaml, or set data.path: synthetic to generate one.",
        )
    data = yaml.safe_load(data_yaml.read_text()) or {}
    key = f"data.path ({data_yaml})"
    names = _names(data)
    if not names:
        raise ConfigError(source, key, "has no class `names` (or `nc`).", "add `names: {0: cat, 1: dog}` to it.")
    root = dataset_root(data_yaml, data)
    for split in ("train", "val"):
        if split not in data:
            raise ConfigError(source, key, f"has no `{split}:` entry.", f"add `{split}: images/{split}` to it.")
        images, missing = image_files(data[split], root)
        if missing:
            raise ConfigError(
                source,
                key,
                f"its {split} images are missing: {', '.join(map(str, missing))}.",
                f"fix `{split}:` (relative to `path: {root}`) or put the images there.",
            )
        if not images:
            raise ConfigError(
                source, key, f"its {split} folder holds no images.", f"put images (.jpg/.png) under {data[split]}."
            )
        with ThreadPoolExecutor(16) as pool:
            for bad in pool.map(lambda im: _bad_class(label_file(im), len(names)), images):
                if bad:
                    f, line, cls = bad
                    raise ConfigError(
                        source,
                        key,
                        f"label {f} line {line} has class id {cls}, but the dataset "
                        f"has nc={len(names)} classes (ids 0..{len(names) - 1}).",
                        "fix the label file or add the missing class to `names`.",
                    )

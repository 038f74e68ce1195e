"""Every image and label file of a split, checked with Ultralytics' rules without modifying anything: a class id
that is not an integer in 0..nc-1 or a label file that is not text is an error naming the file and line; images
Ultralytics would drop are counted and named, and above data.max_bad_fraction the run is refused."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from yolo_ray import tasks
from yolo_ray.config import ConfigError, ExperimentConfig

SHOWN_BAD = 5  # unusable files named in a message


@dataclass
class Split:
    """One split as checked: its images (absolute, Ultralytics' order), and what of them is usable."""

    images: list[str]
    labelled: int = 0  # images with a non-empty label file
    boxes: int = 0
    unusable: list[tuple[str, str]] = field(default_factory=list)  # (image, why Ultralytics would drop it)


def scan(split: Split, rule: LabelRule) -> None:
    """Every image and label of a split, in threads (reading and decoding headers release the GIL)."""
    from ultralytics.data.utils import img2label_paths

    labels = img2label_paths(split.images)
    with ThreadPoolExecutor(min(32, (os.cpu_count() or 1) * 4)) as pool:
        pairs = zip(split.images, labels, strict=True)
        results = list(pool.map(lambda pair: _check_pair(*pair, rule), pairs))
    rule.refuse_mismatch(split)
    for image, (boxes, why) in zip(split.images, results, strict=True):
        if why:
            split.unusable.append((image, why))
        elif boxes:
            split.labelled += 1
            split.boxes += boxes


def _check_pair(image: str, label: str, rule: LabelRule) -> tuple[int, str | None]:
    """(boxes, None) for a usable image; (0, why) for one Ultralytics would drop. A class id that is not an integer
    in 0..nc-1, and a label file that is not text, raise ConfigError naming the file and line."""
    why = image_problem(image)
    boxes, label_why = rule.rows(Path(label))
    return (0, why) if why else (0, label_why) if label_why else (boxes, None)


def image_problem(image: str) -> str | None:
    """Ultralytics' check_image verdict, read-only (it rewrites a JPEG that lacks its end marker, and trains it)."""
    from PIL import Image, UnidentifiedImageError
    from ultralytics.data.utils import IMG_FORMATS

    try:
        with Image.open(image) as im:
            im.verify()
            w, h = im.size
            fmt = (im.format or "").lower()
    except (UnidentifiedImageError, ImportError):  # Ultralytics' patched open tries HEIF (pi_heif) last
        return "unreadable image (no image format PIL knows)"
    except Exception as e:  # truncated, zero bytes, bad header: PIL's many ways of saying so
        return f"unreadable image ({' '.join(str(e).split()) or type(e).__name__})"
    if w < 10 or h < 10:
        return f"image {w}x{h} px is under Ultralytics' 10 px minimum"
    if fmt not in IMG_FORMATS | {"jpeg2000"}:
        return f"image format {fmt or 'unknown'} is not one Ultralytics reads"
    return None


@dataclass
class LabelRule:
    """Ultralytics' verify_image_label rules for one task's label rows: detection boxes (or polygons, which it
    turns into boxes), segment polygons, OBB corners, pose boxes with kpt_shape's keypoints."""

    nc: int
    task: str
    source: str
    key: str
    kpt_shape: tuple[int, int] = (0, 3)  # pose: keypoints, and 2 (x y) or 3 (x y visible) values each
    kinds: set[str] = field(default_factory=set)  # the rows seen in a split: box, polygon

    def rows(self, label: Path) -> tuple[int, str | None]:
        """(objects, why the label would be dropped)."""
        if not label.is_file():
            return 0, None  # no label file: a background image
        text = utf8_text(label, self.source, self.key)
        rows = [(n, line.split()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        for n, fields in rows:
            _check_class(fields[0], self.nc, label, n, self.source, self.key)
        segments = self.task in ("detect", "segment") and any(len(f) > 6 for _, f in rows)
        for n, fields in rows:
            why = self._row_problem(fields, segments)
            if why:
                return 0, f"{label.name} line {n}: {why}"
        if rows:
            self.kinds.add("polygon" if segments else "box")
        return len(rows), None

    def _row_problem(self, fields: list[str], segments: bool) -> str | None:
        columns = {"obb": 9, "pose": 5 + self.kpt_shape[0] * self.kpt_shape[1]}.get(self.task, 5)
        if segments and len(fields) == 5:
            return "a box row among polygon rows"
        if not segments and len(fields) != columns:
            return f"{len(fields)} columns; {self.task} labels have {columns} ({tasks.get(self.task).labels})"
        try:
            coords = [float(v) for v in fields[1:]]
        except ValueError:
            return "coordinates that are not numbers"
        if self.task == "pose" and self.kpt_shape[1] == 3:  # a keypoint's third value is its visibility (0, 1, 2)
            coords = coords[:4] + [v for i, v in enumerate(coords[4:]) if i % 3 != 2]
        if max(coords) > 1.01:
            return "coordinates above 1 (YOLO labels are normalised to 0..1)"
        if min(coords) < -0.01 or (self.task in ("detect", "pose") and not segments and min(coords[2:4]) < 0):
            return "negative coordinates"
        return None

    def refuse_mismatch(self, split: Split) -> None:
        """A segment model on box-only labels trains nothing of what it is for: refused, not silently wrong."""
        if self.task == "segment" and "box" in self.kinds and "polygon" not in self.kinds:
            raise ConfigError(
                self.source, self.key,
                "its labels are boxes (class x y w h); a segment model learns masks from polygon labels.",
                "give polygon labels (class x1 y1 x2 y2 ...), or train a detection model (e.g. yolo11n.yaml).",
            )  # fmt: skip


def _check_class(text: str, nc: int, label: Path, line: int, source: str, key: str) -> None:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    integral = math.isfinite(value) and value == int(value)
    if not integral or not 0 <= value < nc:
        what = f"class id {int(value)}" if integral else f"{text!r} is not a class id (an integer)"
        raise ConfigError(
            source,
            key,
            f"label {label} line {line}: {what}; the dataset has nc={nc} classes (ids 0..{nc - 1}).",
            "make the first column an integer class id in that range, or add the class to `names`.",
        )


def refuse_unusable(split: Split, name: str, cfg: ExperimentConfig, key: str) -> None:
    """Say what Ultralytics would drop; refuse the run when it is more than data.max_bad_fraction of the split."""
    bad = split.unusable
    if not bad:
        return
    share, limit = len(bad) / len(split.images), cfg.data.max_bad_fraction
    shown = "; ".join(f"{Path(f).name}: {why}" for f, why in bad[:SHOWN_BAD])
    shown += "; ..." if len(bad) > SHOWN_BAD else ""
    what = f"{len(bad)} of {len(split.images)} {name} images ({share:.1%}) are unusable: {shown}"
    if share > limit:
        raise ConfigError(
            cfg.source,
            key,
            f"{what}. That is more than data.max_bad_fraction={limit:g}.",
            "repair or remove those files (`yolo-ray check` lists them), or raise data.max_bad_fraction.",
        )
    print(f"[yolo_ray] data: {what}. Ultralytics skips them (data.max_bad_fraction={limit:g}).", flush=True)


def utf8_text(path: Path, source: str, key: str) -> str:
    """A label file or image list as text (a BOM allowed, as Ultralytics reads them); else ConfigError."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(
            source, key, f"{path} is not UTF-8 text.", "save it as UTF-8 (labels and image lists are text files)."
        ) from None

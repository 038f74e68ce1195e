"""The dataset, checked and resolved on the driver before Ray starts.

Ultralytics resolves a data.yaml's paths from the process's working directory (`path: .`, relative lines of a .txt
image list) and its datasets dir, and silently drops images it cannot use (a warning in one worker's log). A Ray
worker runs in Ray's session directory, so the driver resolves every path once, as Ultralytics would from the
user's directory (with Ultralytics' own functions), and hands the workers a data.yaml of absolute paths (write()).
Every image and label is checked here with Ultralytics' rules, without modifying anything: a class id that is not
an integer in 0..nc-1 or a label file that is not text is an error naming the file and line; images Ultralytics
would drop are counted and named, and above data.max_bad_fraction the run is refused.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError, ExperimentConfig
from yolo_ray.data import stream_source, synth
from yolo_ray.data.label_checks import LabelRule, Split, image_problem, refuse_unusable, scan, utf8_text

SPLITS = ("train", "val")


@dataclass
class Dataset:
    """A checked dataset: Ultralytics' resolved data dict (absolute paths), and each split's images."""

    source: Path  # the data.yaml as given (or generated); for classify, the dataset's folder
    data: dict[str, Any]
    splits: dict[str, Split]
    task: str = "detect"
    stream: stream_source.StreamIndex | None = None  # data.loader=stream: the train split's files as it reads them

    @property
    def names(self) -> dict[int, str]:
        return self.data["names"]

    def digest(self, split: str | None = None) -> str:
        """Ultralytics' own dataset hash (paths and sizes of images and labels: what its label cache is keyed by),
        of one split or of all."""
        from ultralytics.data.utils import get_hash, img2label_paths

        files = [f for name, s in self.splits.items() if split in (None, name) for f in s.images]
        return get_hash(img2label_paths(files) + files)

    @property
    def name(self) -> str:
        """The dataset's folder name (a generated one: its data.yaml's folder too)."""
        return Path(self.data["path"]).name or self.source.parent.name

    def describe(self) -> str:
        """What `yolo-ray check` says of it: per split, images, labelled images, boxes and unusable images."""
        lines = [f"data: {self.source} ({len(self.names)} classes)"]
        for name, s in self.splits.items():
            lines.append(
                f"  {name}: {len(s.images)} images, {s.labelled} with boxes ({s.boxes} boxes), {len(s.unusable)} "
                "unusable" + "".join(f"\n    {f}: {why}" for f, why in s.unusable)
            )
        return "\n".join(lines)

    def write(self, out_dir: Path) -> Path:
        """out_dir/data.yaml for the workers: every split as one absolute folder or an absolute image list. A
        classification dataset is its folder (Ultralytics reads no data.yaml for it): that, absolute."""
        if self.task == "classify":
            return Path(self.data["path"])
        out_dir.mkdir(parents=True, exist_ok=True)
        data = {k: v for k, v in self.data.items() if k not in ("yaml_file", "path") and not isinstance(v, Path)}
        data["path"] = str(self.data["path"])
        for name in SPLITS:
            entry = self.data[name]
            if stream_source.is_uri(entry) or isinstance(entry, str) and Path(entry).is_dir():
                data[name] = entry  # a folder Ultralytics lists itself: already absolute
            else:  # a .txt list or several entries: one list of absolute image paths
                listed = out_dir / f"data-{name}.txt"
                listed.write_text("\n".join(self.splits[name].images) + "\n")
                data[name] = str(listed)
        out = out_dir / layout.DATA_YAML
        out.write_text(yaml.safe_dump(data, sort_keys=False))
        return out


def prepare(cfg: ExperimentConfig, task: str = "detect") -> Dataset:
    """The dataset to train on: generated for `synthetic` (the task's kind), else the one given; checked."""
    if cfg.data.path == "synthetic":
        s = cfg.data.synthetic
        spec = synth.SynthSpec(s.images, s.imgsz, s.classes, s.seed, style=s.style, task=task)
        try:
            spec.validate()
        except ValueError as e:
            raise ConfigError(cfg.source, "data.synthetic", str(e), "change data.synthetic for this task.") from None
        path = synth.dataset_path(synth.ensure(cfg.data.dir, spec), task)
    else:
        path = Path(cfg.data.path).expanduser()
    if task == "classify":
        return check_classify(path, cfg)
    return check(path, cfg, task)


def check(data_yaml: Path, cfg: ExperimentConfig, task: str = "detect") -> Dataset:
    source, key = cfg.source, f"data.path ({data_yaml})"
    train = _load_yaml(data_yaml, source)["train"]  # as written: Ultralytics' check makes a URI a local path
    remote = stream_source.is_uri(train)
    data = _resolved(data_yaml, source, key)
    kpt_shape = _kpt_shape(data, task, source, key)
    splits, stream = {}, None
    if remote:  # listed, not scanned: the stream reads it
        data["train"] = _remote_train(train, cfg, key)
        stream = stream_source.index(data["train"], source, key, cfg.data.s3_endpoint)
        splits["train"] = Split([f"s3://{im}" for im in stream.images], labelled=sum(map(bool, stream.labels)))
    for name in SPLITS:
        if name not in splits:
            splits[name] = Split(_images(data[name], source, key, name))
            scan(splits[name], LabelRule(len(data["names"]), task, source, key, kpt_shape))
            refuse_unusable(splits[name], name, cfg, key)
    if cfg.data.loader == "stream" and stream is None:
        stream = stream_source.index(str(data["train"]), source, key, local_images=splits["train"].images)
    if not splits["val"].labelled:
        raise ConfigError(
            source,
            key,
            f"none of its {len(splits['val'].images)} val images has a label: mAP cannot be measured.",
            "put YOLO label files under the val split's labels/ folder, or point `val:` at a labelled split.",
        )
    return Dataset(data_yaml.resolve(), data, splits, task, stream)


def _remote_train(entry: str, cfg: ExperimentConfig, key: str) -> str:
    """The train split's URI, for the stream loader only."""
    if cfg.data.loader != "stream":
        raise ConfigError(
            cfg.source,
            key,
            f"its train split {entry} is in object storage; data.loader={cfg.data.loader} reads local files only.",
            "set data.loader: stream (it reads s3:// splits through Ray Data), or copy the split to a local folder.",
        )
    return entry


def _kpt_shape(data: dict[str, Any], task: str, source: str, key: str) -> tuple[int, int]:
    """A pose dataset's (keypoints, values a keypoint); (0, 3) for other tasks."""
    if task != "pose":
        return 0, 3
    shape = data.get("kpt_shape")
    if not (isinstance(shape, list) and len(shape) == 2 and shape[1] in (2, 3) and shape[0] >= 1):
        raise ConfigError(
            source, key, f"has kpt_shape {shape!r}; a pose model needs `kpt_shape: [keypoints, 2 or 3]`.",
            "add kpt_shape (e.g. [17, 3] for COCO's keypoints) and flip_idx to the data.yaml.",
        )  # fmt: skip
    flips = data.get("flip_idx")
    if flips is not None and not (isinstance(flips, list) and sorted(flips) == list(range(shape[0]))):
        raise ConfigError(
            source, key, f"has flip_idx {flips!r}; it must list each of the {shape[0]} keypoints once (its index after "
            "a left-right flip).", "fix flip_idx (e.g. [1, 0, 3, 2] swaps keypoints 0/1 and 2/3), or remove it: "
            "without it no image is flipped.",
        )  # fmt: skip
    return int(shape[0]), int(shape[1])


def check_classify(folder: Path, cfg: ExperimentConfig) -> Dataset:
    """A classification dataset: a folder with train/ and val/ (or test/), a folder per class in each."""
    source, key = cfg.source, f"data.path ({folder})"
    if not folder.is_dir():
        what = f"{folder} is not a folder; a classification dataset is one (train/ and val/, a folder per class)."
        raise ConfigError(source, "data.path", what, "point data.path at that folder (no data.yaml).")
    folder = folder.resolve()
    val = _classify_root(folder, "val")
    names: list[str] = []
    splits: dict[str, Split] = {}
    for name, root in (("train", folder / "train"), ("val", val)):
        classes = sorted(d.name for d in root.glob("*") if d.is_dir()) if root.is_dir() else []
        if not classes:
            what = f"has no {root.name}/ folder with a folder per class."
            raise ConfigError(source, key, what, f"put {root.name}/<class>/<image> under {folder}.")
        if name == "val" and classes != names:
            what = f"its val classes {classes} are not its train classes {names}."
            raise ConfigError(source, key, what, "give val/ the same class folders as train/.")
        names = classes
        split = splits[name] = Split(_class_images(root, classes))
        for image in split.images:
            why = image_problem(image)
            if why:
                split.unusable.append((image, why))
        split.labelled = split.boxes = len(split.images) - len(split.unusable)
        refuse_unusable(split, name, cfg, key)
    data = {"path": folder, "train": str(folder / "train"), "val": str(val), "names": dict(enumerate(names))}
    return Dataset(folder, {**data, "nc": len(names)}, splits, "classify")


def _classify_root(folder: Path, split: str) -> Path:
    """A classification dataset's folder for a split: val/, or test/ where it has no val/ (as Ultralytics reads it)."""
    return folder / "test" if split == "val" and not (folder / "val").is_dir() else folder / split


def _class_images(root: Path, classes: list[str]) -> list[str]:
    """The images under a classification split's class folders, class by class."""
    from ultralytics.data.utils import IMG_FORMATS

    files = [str(f) for c in classes for f in sorted((root / c).rglob("*.*"))]
    return [f for f in files if f.rpartition(".")[-1].lower() in IMG_FORMATS]


def split_images(data_yaml: Path, split: str) -> list[Path]:
    """One split's images as the checks (and Ultralytics) find them; for tools that read a checked dataset (a
    classification dataset: its folder)."""
    if data_yaml.is_dir():
        root = _classify_root(data_yaml, split)
        return [Path(f) for f in _class_images(root, sorted(d.name for d in root.iterdir() if d.is_dir()))]
    key = f"data.path ({data_yaml})"
    return [Path(f) for f in _images(_resolved(data_yaml, str(data_yaml), key)[split], str(data_yaml), key, split)]


def _load_yaml(data_yaml: Path, source: str) -> dict[str, Any]:
    """Errors a user can fix in the file itself, named before Ultralytics reads it."""
    if data_yaml.is_dir():
        what = f"{data_yaml} is a directory."  # a classification dataset is one: but this model's task is not
        raise ConfigError(source, "data.path", what, "point data.path at its data.yaml (a -cls model takes a folder).")
    if not data_yaml.is_file():
        raise ConfigError(
            source,
            "data.path",
            f"dataset file {data_yaml} does not exist.",
            "point data.path at a YOLO data.yaml, or set data.path: synthetic to generate one.",
        )
    key = f"data.path ({data_yaml})"
    try:
        data = yaml.safe_load(data_yaml.read_text(encoding="utf-8-sig"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(source, key, f"is not valid YAML ({' '.join(str(e).split())}).", "fix its syntax.") from None
    if not isinstance(data, dict):
        what = f"holds a {type(data).__name__}, not a mapping."
        raise ConfigError(source, key, what, "write it as `train:`, `val:` and `names:` keys.")
    for split in SPLITS:
        if not data.get(split) and not (split == "val" and data.get("validation")):
            raise ConfigError(source, key, f"has no `{split}:` entry.", f"add `{split}: images/{split}` to it.")
    return data


def _resolved(data_yaml: Path, source: str, key: str) -> dict[str, Any]:
    """Ultralytics' check_det_dataset from the driver's working directory: names and nc checked, paths absolute."""
    from ultralytics.data.utils import check_det_dataset

    try:
        data = check_det_dataset(str(data_yaml), autodownload=False)
    except FileNotFoundError as e:
        missing = re.search(r"missing path '([^']+)'", str(e))
        where = missing.group(1) if missing else str(e).splitlines()[0]
        raise ConfigError(
            source, key, f"its val images are missing: {where} does not exist.", "fix `val:` or put the images there."
        ) from None
    except (SyntaxError, TypeError, ValueError, KeyError) as e:
        problem = " ".join(str(e).replace("❌", "").split())
        raise ConfigError(source, key, f"Ultralytics rejects it: {problem}", "fix the data.yaml as it says.") from None
    data["path"] = Path(data["path"]).resolve()  # `path: .` is the driver's working directory, made absolute
    return data


def _images(entry: str | list[str], source: str, key: str, split: str) -> list[str]:
    """A split's images as Ultralytics lists them (a folder searched recursively, symlinks followed; a .txt list
    whose `./` lines are relative to the list), every path made absolute from the driver's working directory."""
    from ultralytics.data.utils import IMG_FORMATS

    found: list[str] = []
    for item in entry if isinstance(entry, list) else [entry]:
        p = Path(item)
        if p.is_dir():
            found += glob.glob(str(Path(glob.escape(str(p))) / "**" / "*.*"), recursive=True)
        elif p.is_file():
            found += [_listed(line, p) for line in utf8_text(p, source, key).splitlines() if line.strip()]
        else:
            what = f"its {split} images are missing: {p} does not exist."
            raise ConfigError(source, key, what, f"fix `{split}:` or put the images there.")
    images = sorted(str(Path(f).resolve()) for f in found if f.rpartition(".")[-1].lower() in IMG_FORMATS)
    if not images:
        raise ConfigError(
            source,
            key,
            f"its {split} split ({entry}) holds no images.",
            f"put images ({', '.join(sorted(IMG_FORMATS)[:6])}, ...) there or fix `{split}:`.",
        )
    return images


def _listed(line: str, list_file: Path) -> str:
    line = line.strip()
    return str(list_file.parent / line[2:]) if line.startswith("./") else line  # else: the working directory's

"""Where data.loader=stream reads its training images, checked on the driver: a local folder, or object storage
(`train: s3://bucket/prefix/images/train` in the data.yaml) through pyarrow's filesystems.

The driver lists the split once (names only: no image is read) and pairs each image with its label file by
Ultralytics' rule (`/images/` -> `/labels/`, suffix `.txt`); a bucket that cannot be reached, credentials that are
refused, an empty prefix or a split without labels stop the run here (exit 2), before any worker is placed. The rows
(id, image path, label path) become the Ray Dataset that Ray Train splits across its workers (stream_loader.py reads
them). Credentials are the usual AWS ones (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, an instance role, ...) where
the reading runs: the driver's environment for a local Ray, every node's on a cluster (`ray job submit
--runtime-env-json` can carry them); the endpoint of an S3-compatible server: data.s3_endpoint or AWS_ENDPOINT_URL.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from yolo_ray.config import ConfigError

S3_SCHEMES = ("s3://", "s3a://")


def is_uri(entry: Any) -> bool:
    """A data.yaml entry in object storage (only the stream loader reads those)."""
    return isinstance(entry, str) and entry.startswith(S3_SCHEMES)


def label_path(image: str) -> str:
    """Ultralytics' img2label_paths for one path of any filesystem: the last /images/ becomes /labels/, .txt."""
    head, sep, tail = image.rpartition("/images/")
    stem = (head + "/labels/" + tail) if sep else image
    return stem.rpartition(".")[0] + ".txt"


@dataclass(frozen=True)
class Filesystem:
    """How a process (driver, Ray Data task) opens the split's files: picklable, built into a pyarrow filesystem
    once per process."""

    kind: str = "local"  # local | s3
    endpoint: str = ""  # S3-compatible server (http://host:port); "": AWS itself
    region: str = ""

    @classmethod
    def s3(cls, endpoint: str = "") -> Filesystem:
        """Endpoint and region resolved on the driver (config, else its AWS_* environment), so the reading tasks on
        every node use the ones the driver checked."""
        env = os.environ.get
        endpoint = endpoint or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL") or ""
        return cls("s3", endpoint, env("AWS_REGION") or env("AWS_DEFAULT_REGION") or "")

    def open(self) -> Any:
        return _pyarrow_fs(self)

    def read(self, path: str) -> bytes:
        with self.open().open_input_file(path) as f:
            return f.read()


@functools.lru_cache(maxsize=4)
def _pyarrow_fs(spec: Filesystem) -> Any:
    import pyarrow.fs as pafs

    if spec.kind == "local":
        return pafs.LocalFileSystem()
    kwargs: dict[str, Any] = {"connect_timeout": 5, "request_timeout": 30}
    if spec.endpoint:
        url = urlparse(spec.endpoint if "://" in spec.endpoint else f"https://{spec.endpoint}")
        kwargs.update(endpoint_override=url.netloc, scheme=url.scheme)
    if spec.region:
        kwargs["region"] = spec.region
    return pafs.S3FileSystem(**kwargs)


@dataclass(frozen=True)
class StreamIndex:
    """The training split as the stream reads it: image and label paths within `fs` (label "" = none: a
    background image, as Ultralytics treats an image without a label file)."""

    fs: Filesystem
    images: list[str]
    labels: list[str]
    where: str  # the split as the user named it (for messages)

    def padded(self, multiple: int) -> int:
        """How many rows: the images padded to a multiple of `multiple` (the workers), as DistributedSampler pads."""
        return len(self.images) + (-len(self.images)) % max(1, multiple)

    def rows(self, multiple: int = 1) -> list[dict[str, Any]]:
        """One row per image, then the first ones again up to padded(multiple): every worker takes as many rows,
        so every rank steps as often."""
        pairs = enumerate(zip(self.images, self.labels, strict=True))
        rows = [{"id": i, "image": im, "label": lb} for i, (im, lb) in pairs]
        return rows + rows[: self.padded(multiple) - len(rows)]


def index(entry: str, source: str, key: str, endpoint: str = "", local_images: list[str] | None = None) -> StreamIndex:
    """The split `entry` (an s3:// prefix, or a local split already listed by checks: local_images) as rows."""
    if not is_uri(entry):
        images = sorted(local_images or [])
        labels = [label_path(im) for im in images]
        return StreamIndex(Filesystem("local"), images, [lb if os.path.isfile(lb) else "" for lb in labels], entry)
    fs = Filesystem.s3(endpoint)
    prefix = entry.split("://", 1)[1].strip("/")
    images = _list(fs, prefix, entry, source, key, images=True)
    labels = set(_list(fs, label_path(prefix + "/x.jpg").rpartition("/")[0], entry, source, key, images=False))
    paired = [label_path(im) for im in images]
    out = StreamIndex(fs, images, [lb if lb in labels else "" for lb in paired], entry)
    if not any(out.labels):
        raise ConfigError(
            source,
            key,
            f"none of the {len(images)} images under {entry} has a label file (looked for e.g. s3://{paired[0]}).",
            "put YOLO label files under the split's labels/ prefix (images/ -> labels/, .txt), or fix `train:`.",
        )
    return out


def _list(fs: Filesystem, prefix: str, entry: str, source: str, key: str, images: bool) -> list[str]:
    """Every file under prefix (images: those with an image suffix); unreachable or refused storage is a ConfigError."""
    import pyarrow.fs as pafs
    from ultralytics.data.utils import IMG_FORMATS

    bucket = prefix.split("/", 1)[0]
    try:
        handle = fs.open()
        if handle.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise ConfigError(source, key, f"bucket {bucket!r} of {entry} does not exist.", "fix the bucket name.")
        found = handle.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    except OSError as e:
        raise ConfigError(source, key, _storage_problem(e, entry), _storage_fix(e)) from None
    files = [f.path for f in found if f.type == pafs.FileType.File]
    if not images:
        return [f for f in files if f.endswith(".txt")]
    out = sorted(f for f in files if f.rpartition(".")[-1].lower() in IMG_FORMATS)
    if not out:
        raise ConfigError(
            source,
            key,
            f"its train split {entry} holds no images ({len(files)} other files).",
            "upload the images there (jpg, png, ...), or fix `train:`.",
        )
    return out


def _storage_problem(e: OSError, entry: str) -> str:
    text = " ".join(str(e).split())
    return f"{entry} cannot be listed: {text[:300]}"


def _storage_fix(e: OSError) -> str:
    text = str(e)
    if "NETWORK_CONNECTION" in text or "Could not connect" in text or "resolve host" in text:
        return "check data.s3_endpoint (or AWS_ENDPOINT_URL) and that the server is up and reachable from here."
    if "ACCESS_KEY" in text or "ACCESS_DENIED" in text or "SIGNATURE" in text or "403" in text:
        return (
            "give credentials that may read the bucket (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or an instance "
            "role) in the environment of the driver and of every node."
        )
    return "check the URI, the endpoint (data.s3_endpoint) and the credentials."

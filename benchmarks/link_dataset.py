"""A large training split made of COPIES hard links to each image (and label) of a generated one, for the stream
loader's scale benchmark: the same bytes under new names, so a 10k-image set becomes 50k files in seconds and the
reading, decoding and memory scale as with 50k distinct images (the val split is the source's).

    python benchmarks/link_dataset.py datasets/scale10k/data.yaml datasets/scale50k 5
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml


def link(data_yaml: Path, out: Path, copies: int) -> Path:
    data = yaml.safe_load(data_yaml.read_text())
    root = Path(data.get("path") or data_yaml.parent)
    root = root if root.is_absolute() else (data_yaml.parent / root).resolve()
    train = root / data["train"]
    for kind in ("images", "labels"):
        src = train if kind == "images" else train.parent / "labels"
        dst = out / "train" / kind
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.iterdir()):
            for k in range(copies):
                target = dst / f"{k}_{f.name}"
                if not target.exists():
                    os.link(f, target)
    data.pop("synthetic", None)
    data.update(path=str(out.resolve()), train="train/images", val=str((root / data["val"]).resolve()))
    (out / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return out / "data.yaml"


if __name__ == "__main__":
    print(link(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))

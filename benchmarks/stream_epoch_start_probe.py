"""What the stream's epoch start costs in Ray Data, apart from decoding and training: N rows (16 small files read
over and over, bytes only) through the stream's pipeline on a local Ray of CPUS CPUs, each epoch's first batch and
whole epoch timed. `one`: stream_pipeline.pipeline (the rows shuffled in one task, then cut into read blocks), its
blocks in the order they finish; `ordered`: the same in order (train.deterministic: Ray Data's preserve_order);
`blocks`: the earlier pipeline (Ray Data's all-to-all shuffle of the read blocks themselves, two tasks a block).

    python benchmarks/stream_epoch_start_probe.py 10000 --variants blocks,one,ordered [--cpus 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import ray
import ray.data
from ray.data import RandomSeedConfig

from yolo_ray.data import stream_pipeline
from yolo_ray.data.stream_source import Filesystem

BATCH = 64


def rows(n: int, root: Path) -> list[dict]:
    for i in range(16):
        (root / f"{i}.jpg").write_bytes(os.urandom(2000))
        (root / f"{i}.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    return [{"id": i, "image": str(root / f"{i % 16}.jpg"), "label": str(root / f"{i % 16}.txt")} for i in range(n)]


def dataset(variant: str, items: list[dict]) -> ray.data.Dataset:
    fs = Filesystem("local")
    if variant in ("one", "ordered"):
        return stream_pipeline.pipeline(items, fs, 64, False, seed=0, batch=BATCH)
    blocks = max(1, min(len(items) // BATCH, stream_pipeline.MAX_BLOCKS))
    ds = ray.data.from_items(items, override_num_blocks=blocks)
    ds = ds.random_shuffle(seed=RandomSeedConfig(seed=0, reseed_after_execution=True))
    kwargs = {"fs": fs, "imgsz": 64, "decode": False}
    return ds.map_batches(stream_pipeline.read_rows, fn_kwargs=kwargs, batch_size=BATCH, num_cpus=1)


def epochs(variant: str, items: list[dict], count: int) -> list[dict]:
    """Each epoch's seconds to its first batch and to its end, and whether it served every row once."""
    shard = stream_pipeline.split(dataset(variant, items), 1, ordered=variant == "ordered")[0]
    out = []
    for e in range(count):
        t, first, ids = time.perf_counter(), None, []
        for b in shard.iter_batches(batch_size=BATCH, batch_format="numpy", prefetch_batches=4):
            first = first if first is not None else time.perf_counter() - t
            ids += b["id"].tolist()
        out.append({"epoch": e, "first_batch_s": round(first or 0.0, 2), "epoch_s": round(time.perf_counter() - t, 2),
                    "every_row_once": sorted(ids) == list(range(len(items)))})  # fmt: skip
        print(variant, len(items), out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", type=int)
    ap.add_argument("--variants", default="blocks,one")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    ray.init(num_cpus=a.cpus, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = ctx.print_on_execution_start = False
    ctx.op_resource_reservation_enabled = False
    with tempfile.TemporaryDirectory() as root:
        items = rows(a.rows, Path(root))
        result = {v: epochs(v, items, a.epochs) for v in a.variants.split(",")}
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": a.rows, "cpus": a.cpus, "epochs": result}, indent=1))


if __name__ == "__main__":
    main()

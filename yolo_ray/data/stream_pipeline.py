"""data.loader=stream, the Ray Data side (it runs on any node's CPUs): the train split's rows shuffled anew each
epoch, read (image bytes; label rows, parsed) and, with data.stream_decode cpu, decoded and resized with OpenCV as
Ultralytics' load_image does; then split across the Train workers by Ray Train. stream_loader.py is the rank's side
(it decodes the bytes itself with stream_decode device or worker)."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from yolo_ray import run_layout as layout
from yolo_ray.data import stream_labels
from yolo_ray.data.image_decode import decode_into
from yolo_ray.data.stream_source import Filesystem
from yolo_ray.summary import newest_checkpoint

FETCH_THREADS = 16  # concurrent reads per Ray Data task: object storage is latency-bound
MAX_BLOCKS = 200  # read tasks an epoch at most: on a large set, a few batches a task rather than more tasks


def read_rows(batch: dict[str, np.ndarray], fs: Filesystem, imgsz: int, decode: bool) -> dict[str, np.ndarray]:
    """map_batches: each row's image bytes and label rows (parsed and packed: stream_labels.py), read in threads;
    with decode, the image decoded and resized here as Ultralytics' load_image does it (cv2, long side = imgsz,
    INTER_LINEAR), in an imgsz^2 slot."""

    def read(i: int) -> tuple[bytes, str]:
        label = batch["label"][i]
        return fs.read(batch["image"][i]), (fs.read(label).decode("utf-8", "replace") if label else "")

    with ThreadPoolExecutor(min(FETCH_THREADS, len(batch["id"]))) as pool:
        got = list(pool.map(read, range(len(batch["id"]))))
    out = {"id": batch["id"], "file": batch["image"], "labels": _bytes_column([stream_labels.pack(t) for _, t in got])}
    if not decode:
        out["data"] = _bytes_column([d for d, _ in got])
        return out
    import cv2

    cv2.setNumThreads(1)  # this task holds one CPU; OpenCV's own threads would oversubscribe the node (as Ultralytics')
    pixels = np.empty((len(got), imgsz, imgsz, 3), dtype=np.uint8)
    hw = np.array([decode_into(pixels[i], d, batch["image"][i]) for i, (d, _) in enumerate(got)], dtype=np.int32)
    out.update(pixels=pixels, hw=hw)
    return out


def _bytes_column(items: list[bytes]) -> np.ndarray:
    """1-D object array of bytes, whatever their sizes (numpy would stack equal-sized ones into a 2-D array)."""
    return np.array([*items, b""], dtype=object)[:-1]


def pipeline(
    rows: list[dict[str, Any]],
    fs: Filesystem,
    imgsz: int,
    decode_on_cpu: bool,
    seed: int,
    batch: int,
    verbose: bool = False,
) -> Any:
    """The Ray Dataset the launcher hands TorchTrainer: rows shuffled anew each execution (epoch), then read, a
    worker's batch (`batch` rows) a task, so a rank's batches arrive without being cut and joined again; split
    across the workers as `ingest_config` says."""
    import ray.data
    from ray.data import DataContext, RandomSeedConfig

    ctx = DataContext.get_current()  # travels with the dataset to Ray Train's split coordinator
    ctx.enable_progress_bars = ctx.print_on_execution_start = verbose  # else a bar and a banner every epoch
    # one budget for all operators instead of a reserved share each: the share left the read tasks at 7 of 15 CPUs
    # on one H200 host (feed 810 images/s, 1060 without; benchmarks/stream_feed_probe.py). Still bounded: Ray
    # Data's object store limit holds for the whole pipeline
    ctx.op_resource_reservation_enabled = False
    # the rows (an id and two paths each: 50 000 are a few MB) shuffled in one task, then cut into a read task's
    # blocks. Ray Data's all-to-all shuffle of those blocks ran two tasks a block at each epoch's start: 7.9 s to the
    # first batch on 10 000 images with 2 CPUs, 0.9 s this way (benchmarks/stream_epoch_start_probe.py)
    ds = ray.data.from_items(rows, override_num_blocks=1)
    ds = ds.random_shuffle(seed=RandomSeedConfig(seed=seed, reseed_after_execution=True))
    # a read task per block: blocks of a batch or so keep every CPU decoding on a small set (256-row blocks left 5
    # of 16 CPUs idle on 3000 images)
    ds = ds.repartition(max(1, min(len(rows) // batch, MAX_BLOCKS)))
    return ds.map_batches(
        read_rows,
        fn_kwargs={"fs": fs, "imgsz": imgsz, "decode": decode_on_cpu},
        batch_size=batch,
        # a whole CPU also when a task only reads: with half a CPU the bytes feed on 2 CPUs ran at 684-1193 images/s
        # against 1509-1880 (benchmarks/stream_feed_probe.py --task-cpus; README, the stream loader)
        num_cpus=1,
        batch_format="numpy",
    )


def ingest_config(ordered: bool) -> Any:
    """How Ray Train splits the Dataset across its workers (TorchTrainer's dataset_config): its default options, and
    with `ordered` (train.deterministic) the read blocks in order, so each rank gets the same batches in the same
    order on every run of a seed instead of the blocks as their tasks finish (the split then also ignores locality:
    which rank gets which block depends only on the order). Ray Train takes these from here, not from the Dataset."""
    import ray.train
    from ray.data import DataContext

    # DataConfig.default_ingest_options(), less its warning: it carries DataContext's options over, passing the
    # deprecated exclude_resources (Ray 2.60 warns on every run's driver) to a new ExecutionOptions; a copy does not
    options = copy.copy(DataContext.get_current().execution_options)
    options.preserve_order = ordered
    return ray.train.DataConfig(execution_options=options)


def split(ds: Any, ranks: int, ordered: bool) -> list[Any]:
    """Each rank's shard of `ds` as Ray Train's workers get them (ingest_config's split, no locality hints)."""
    shards = ingest_config(ordered).configure(
        {"train": ds}, world_size=ranks, worker_handles=None, worker_node_ids=None
    )
    return [s["train"] for s in shards]


@dataclass(frozen=True)
class AttemptPipeline:
    """The train Dataset as Ray Train's controller asks for it at each worker-group start (TorchTrainer takes a
    callable). Ray Data counts executions afresh for each group, so a restarted group seeded as the first would
    replay epoch 0's order in the epoch it resumes at: the seed takes in the epoch of the newest checkpoint in the
    run directory, the one the workers resume from (worker.resume_point)."""

    rows: list[dict[str, Any]]
    fs: Filesystem
    imgsz: int
    decode_on_cpu: bool
    seed: int
    batch: int
    run_dir: str
    verbose: bool = False

    def start_epoch(self) -> int:
        newest = newest_checkpoint(layout.checkpoints(Path(self.run_dir)))
        return newest[0] if newest else 0

    def __call__(self) -> Any:
        seed = (self.seed * 1_000_003 + self.start_epoch()) % 2**32
        return pipeline(self.rows, self.fs, self.imgsz, self.decode_on_cpu, seed, self.batch, self.verbose)

"""data.loader=stream: training images read through Ray Data, decoded on its CPUs (or on the GPU), augmented on the
GPU by the device loader's batched augmentation (device_augment.augment_batch). Nothing grows with the dataset
(this module is the rank's side; stream_pipeline.py the Ray Data side):

    Ray Data (any node's CPUs): shuffled rows -> read image bytes + label rows, parsed (-> decode + resize with OpenCV:
    data.stream_decode cpu) -> equal split, one shard per Train worker -> this rank, on a thread of its
    own: (decode + resize with OpenCV in this rank's processes: `worker`; or with nvJPEG + a resize on the device:
    `device`) + the labels, one array -> the training thread: ring buffer on the device -> mosaic (partners from the
    ring) + affine + HSV + flips (one kernel)

Each epoch Ray Data executes the pipeline again (the next epoch's execution starts as soon as this one's rows are
read, so its start overlaps this epoch's end): a new shuffle (seeded by train.seed, the epoch the worker group
started at, and the execution's index), an equal split across the workers (the rows are padded to a multiple of the
workers as DistributedSampler pads), so every image is served once per epoch on one rank. Mosaic partners come from
a ring of the last min(images, 8 x batch, 1000) decoded images (rounded up to whole batches): Ultralytics' own rule,
its Mosaic draws from a buffer of that many recently loaded images whenever it does not cache in RAM. Device memory
for data: ring x imgsz^2 x 3 bytes (0.6 GB at 640 px, batch 64) plus the few batches on their way to it; host memory:
Ray Data's bounded queues and this rank's rows read ahead (ROWS_AHEAD batches), whatever the dataset's size.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from yolo_ray import run_layout as layout
from yolo_ray.data.decode_pool import DecodePool, Pending, default_processes
from yolo_ray.data.device_augment import AugmentHyp, augment_batch
from yolo_ray.data.device_cache import CACHE_SHARE, PAD, DeviceCache, Labels, fits, free_bytes
from yolo_ray.data.device_loader import decode_threads as node_decode_threads
from yolo_ray.data.feed_clock import FeedClock
from yolo_ray.data.image_decode import decode_cpu, resized_hw
from yolo_ray.data.packed_bytes import PackedBytes, arrow_rows
from yolo_ray.data.stream_labels import label_batch

PREFETCH_BATCHES = 4  # batches Ray Data keeps ready for each rank
# batches of rows this rank's reader keeps ahead of its decoding: enough to cover Ray Data's start of the next epoch
# (0.6 s on 3000 images, one H100: ~10 batches at 64) with the bytes read ahead of this epoch's end; bytes (~8 MB a
# batch of 64 at 640 px), or pixels decoded by Ray Data (78 MB a batch: fewer)
ROWS_AHEAD, ROWS_AHEAD_DECODED = 16, 4
EPOCH_END = object()  # the feed's mark between epochs
DECODE_AHEAD = 1  # stream_decode worker: batches handed to the decoding processes before the one being finished


def ring_size(images_per_rank: int, batch: int, rows: int = 0) -> int:
    """Ultralytics' mosaic buffer, min(images, 8 x batch, 1000), in whole batches (rows: data.stream_buffer)."""
    n = rows or min(images_per_rank, 8 * batch, 1000)
    return max(1, math.ceil(n / batch)) * batch


def check_ring_fits(rows: int, imgsz: int, device: torch.device) -> None:
    """The ring takes at most the device cache's share of the free memory; a clear error, naming the setting, where
    data.stream_buffer asks for more."""
    if not fits(rows, imgsz, device):
        need, free = DeviceCache.nbytes(rows, imgsz), free_bytes(device)
        raise RuntimeError(
            f"data.loader=stream: a mosaic ring of {rows} decoded images at imgsz={imgsz} needs {need / 2**30:.1f} GiB "
            f"on {device}, but only {free / 2**30:.1f} GiB is free (the ring may take {CACHE_SHARE:.0%}). Fix: a lower "
            "data.stream_buffer (0: Ultralytics' rule, at most 1000 images) or a lower train.imgsz."
        )


# --------------------------------------------------------------------------------------------- this rank's side


class Prepared(NamedTuple):
    """One batch ready for the ring: its images decoded and resized on the device, its labels as padded tensors."""

    ids: list[int]
    files: list[str]
    pixels: torch.Tensor  # [B, imgsz, imgsz, 3] RGB uint8: each image at long side imgsz, top left, PAD around
    hw: torch.Tensor  # [B, 2]: each image's (h, w) in `pixels`
    labels: Labels  # boxes in pixels of the resized images (no keypoints)
    ready: torch.cuda.Event | None = None  # on a GPU: its copies (made on a side stream) are done

    def tensors(self) -> list[torch.Tensor]:
        """Its tensors on the device."""
        return [self.pixels, self.hw, *self.labels[:3]]

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors())

    def hand_over(self, stream: torch.cuda.Stream) -> None:
        """Makes `stream` (the training thread's) wait for this batch's copies, and keeps the caching allocator from
        reusing their memory before `stream` is done with them."""
        if self.ready is None:
            return
        stream.wait_event(self.ready)
        for t in self.tensors():  # one call a storage: the training thread makes it for every batch
            t.record_stream(stream)


class RingCache:
    """The last `size` decoded images and their labels on the device, as a DeviceCache view for augment_batch."""

    def __init__(self, size: int, imgsz: int, device: torch.device, max_boxes: int = 32):
        self.size, self.imgsz, self.device = size, imgsz, device
        self.images = torch.full((size, imgsz, imgsz, 3), int(PAD), dtype=torch.uint8, device=device)
        self.hw = torch.zeros(size, 2, device=device)
        self.labels = Labels(
            torch.zeros(size, max_boxes, 4, device=device),
            torch.zeros(size, max_boxes, device=device),
            torch.zeros(size, max_boxes, dtype=torch.bool, device=device),
            None,
        )
        self.next, self.filled = 0, 0

    def add(self, batch: Prepared) -> torch.Tensor:
        """A prepared batch into the next slots (on the training thread's stream, after the kernels that read the
        slots before); returns its slots."""
        b, m = len(batch.pixels), batch.labels.boxes.shape[1]
        if m > self.labels.boxes.shape[1]:
            self._grow(m)
        # made on the device: a copy from pageable host memory waits for the whole stream (14% of the training
        # thread on an H200)
        on = (torch.arange(b, device=self.device) + self.next) % self.size
        hw = batch.hw.to(self.device)
        boxes, cls, valid = (t.to(self.device, non_blocking=True) for t in batch.labels[:3])
        # contiguous slots, split in two where the ring wraps: plain copies (an index write is a scatter, and under
        # Ultralytics' deterministic mode a sorted one)
        for ring, src in self._spans(b):
            self.images[ring].copy_(batch.pixels[src])  # one copy: a copy an image took 14% of the thread (H200)
            self.hw[ring] = hw[src]
            self.labels.valid[ring] = False
            self.labels.boxes[ring, :m], self.labels.cls[ring, :m] = boxes[src], cls[src]
            self.labels.valid[ring, :m] = valid[src]
        self.next = (self.next + b) % self.size
        self.filled = min(self.size, self.filled + b)
        return on

    def _spans(self, b: int) -> list[tuple[slice, slice]]:
        """(ring slots, batch rows) for the next b slots: one span, or two where the ring wraps (b <= size)."""
        first = min(b, self.size - self.next)
        spans = [(slice(self.next, self.next + first), slice(0, first))]
        return spans + [(slice(0, b - first), slice(first, b))] if first < b else spans

    def _grow(self, k: int) -> None:
        pad = k - self.labels.boxes.shape[1]
        boxes, cls, valid, _ = self.labels
        self.labels = Labels(F.pad(boxes, (0, 0, 0, pad)), F.pad(cls, (0, pad)), F.pad(valid, (0, pad)), None)

    def held_bytes(self) -> int:
        return sum(t.nbytes for t in (self.images, self.hw, *self.labels[:3]))

    def view(self) -> DeviceCache:
        """The filled slots (all once the ring has wrapped): mosaic partners are drawn among these."""
        n = self.filled
        labels = Labels(self.labels.boxes[:n], self.labels.cls[:n], self.labels.valid[:n], None)
        return DeviceCache(self.images[:n], self.hw[:n], labels)


class Decoder:
    """This rank's decoding of Ray Data's bytes. `device` (stream_decode device): JPEG on the device with nvJPEG
    (torchvision, a batch at a time), other formats (and every image on a CPU device) with OpenCV in threads, then
    resized on the device. `worker`: every image decoded and resized with OpenCV by this rank's own processes
    (decode_pool.py), as Ray Data's tasks do it with stream_decode cpu (to the pixel Ultralytics' load_image), into
    one padded host batch."""

    def __init__(self, imgsz: int, device: torch.device, threads: int, mode: str = "device", batch: int = 0):
        self.imgsz, self.device, self.mode = imgsz, device, mode
        self.pool = ThreadPoolExecutor(max(1, threads)) if mode == "device" else None
        # host batches: DECODE_AHEAD + 1 being decoded while the last two may still be on their way to the device
        procs = default_processes(threads)
        self.procs = DecodePool(imgsz, batch, procs, DECODE_AHEAD + 3, device) if mode == "worker" else None

    def submit(self, data: PackedBytes | Sequence[bytes], files: Sequence[str]) -> Pending:
        """mode worker: a batch's bytes to this rank's decoding processes; `slots` waits for it."""
        assert self.procs is not None
        return self.procs.submit(data, files)

    def slots(self, pending: Pending) -> tuple[torch.Tensor, np.ndarray]:
        """mode worker: the submitted batch as [B, imgsz, imgsz, 3] (page-locked on a GPU host, for one copy without
        a wait) and its images' (h, w)."""
        assert self.procs is not None
        return self.procs.result(pending)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        if self.procs is not None:
            self.procs.close()

    def __call__(self, data: PackedBytes | Sequence[bytes], files: Sequence[str]) -> tuple[torch.Tensor, np.ndarray]:
        """mode device: the batch decoded and resized on the device, as one padded batch [B, imgsz, imgsz, 3] (PAD
        around each image, as `slots` gives it) and each image's (h, w). One resize call per source size (the
        real-shaped set has 9), and the ring then takes the batch in one copy: per image they were ~5 launches each
        on the feed thread and a copy each on the training thread."""
        decoded = self.decode(data, files)
        out = torch.full((len(decoded), self.imgsz, self.imgsz, 3), int(PAD), dtype=torch.uint8, device=self.device)
        sizes = np.zeros((len(decoded), 2), dtype=np.int32)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, im in enumerate(decoded):
            groups.setdefault((im.shape[1], im.shape[2]), []).append(i)
        for (h0, w0), idx in groups.items():
            h, w = resized_hw(h0, w0, self.imgsz)
            x = torch.stack([decoded[i] for i in idx])
            if (h, w) != (h0, w0):  # bilinear with half-pixel centres (cv2's INTER_LINEAR), image by image as one call
                x = F.interpolate(x.float(), size=(h, w), mode="bilinear", align_corners=False, antialias=False)
                x = x.round_().clamp_(0, 255).to(torch.uint8)
            out[torch.tensor(idx, device=self.device), :h, :w] = x.permute(0, 2, 3, 1)
            sizes[idx] = (h, w)
        return out, sizes

    def decode(self, data: PackedBytes | Sequence[bytes], files: Sequence[str]) -> list[torch.Tensor]:
        """Each image RGB, CHW uint8 on the device, at its own size: JPEG with nvJPEG, a batch in one call (on
        A100/H100-class GPUs torchvision's batched decode uses their hardware JPEG engines), the rest with OpenCV in
        threads."""
        out: list[torch.Tensor | None] = [None] * len(data)
        jpeg = [i for i, d in enumerate(data) if self.device.type == "cuda" and bytes(d[:2]) == b"\xff\xd8"]
        if jpeg:
            from torchvision.io import ImageReadMode, decode_jpeg

            raw = [torch.frombuffer(bytearray(data[i]), dtype=torch.uint8) for i in jpeg]
            for i, im in zip(jpeg, decode_jpeg(raw, mode=ImageReadMode.RGB, device=self.device), strict=True):
                out[i] = im
        rest = [i for i in range(len(data)) if out[i] is None]
        decoded = self.pool.map(lambda i: torch.from_numpy(decode_cpu(data[i], str(files[i]))), rest)
        for i, im in zip(rest, decoded, strict=True):
            out[i] = im.permute(2, 0, 1).to(self.device, non_blocking=True)
        return [im for im in out if im is not None]


class StreamIndexDataset:
    """What Ultralytics' trainer reads of a train dataset besides batches: its length (weight decay scaling) and
    labels (the label plots: none here, they would need every label file read)."""

    def __init__(self, images: int):
        self.images, self.labels = images, []

    def __len__(self) -> int:
        return self.images


class EpochSampler:
    """The sampler Ultralytics' trainer sets the epoch of; Ray Data shuffles and splits, so it only counts."""

    def __init__(self, rows_per_rank: int):
        self.epoch, self.rows = 0, rows_per_rank

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Any:
        return iter(())


class StreamLoader:
    """What Ultralytics' trainer uses of its train DataLoader, serving augmented batches from this rank's Ray Data
    shard. Each served batch's image ids go to ranks/stream/rank<R>.<pid>.jsonl (one line a batch, flushed): what
    each rank saw in each epoch, the failed attempt's part of an epoch included."""

    num_workers = 0
    drop_last = False

    def __init__(
        self,
        shard: Any,
        images: int,
        rows: int,
        batch_size: int,
        rank: int,
        world_size: int,
        hyp: AugmentHyp,
        seed: int,
        device: torch.device,
        imgsz: int,
        ring_rows: int,
        record_dir: Path,
        decode: str = "ray",
        decode_threads: int = 1,
        epochs: int = 0,
    ):
        self.shard, self.batch_size, self.hyp, self.rank, self.seed = shard, batch_size, hyp, rank, seed
        self.dataset = StreamIndexDataset(images)
        self.sampler = EpochSampler(rows // max(1, world_size))
        rows_kept = ring_size(len(self.sampler), batch_size, ring_rows)
        check_ring_fits(rows_kept, imgsz, device)
        self.ring = RingCache(rows_kept, imgsz, device)
        # worker: the CPUs Ray gave this rank; device (PNG only on a GPU): the node's CPUs shared among its ranks;
        # ray: Ray Data's tasks decode, and this rank keeps no threads for it
        threads = decode_threads if decode == "worker" else node_decode_threads()
        self.decoder = None if decode == "ray" else Decoder(imgsz, device, threads, decode, batch_size)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.epochs_served: list[int] = []
        # epochs: the run's, read one ahead; epoch_asked: the trainer's latest
        self.epochs, self.epoch_asked, self.asked, self.stopping = epochs, -1, threading.Condition(), False
        self.feed: Prefetched | None = None  # the producer thread, across epochs once started
        self.reader: Prefetched | None = None  # the reader thread, feeding the producer
        self.ends_owed = 0  # epochs the trainer left before their end (Ultralytics' time limit): skipped in the feed
        self.clocks: dict[int, FeedClock] = {}
        # bytes of the batches prepared on the device and not yet in the ring (producer adds, trainer takes off)
        self.in_flight, self.in_flight_peak, self.in_flight_lock = 0, 0, threading.Lock()
        self.feed_clock = FeedClock()  # the epoch being served, or the last one
        record_dir.mkdir(parents=True, exist_ok=True)
        self.record = open(record_dir / f"rank{rank}.{os.getpid()}.jsonl", "a")

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def data_device_bytes(self) -> int:
        """Training data held on the device at its peak this epoch (metrics' data_device_peak_gib): the ring plus
        the batches prepared and not yet in it. The dataset's size does not enter."""
        return self.ring.held_bytes() + self.in_flight_peak

    def _count_in_flight(self, nbytes: int) -> None:
        with self.in_flight_lock:
            self.in_flight += nbytes
            self.in_flight_peak = max(self.in_flight_peak, self.in_flight)

    def __iter__(self) -> Any:
        epoch, dev = self.sampler.epoch, self.ring.device
        with self.in_flight_lock:
            self.in_flight_peak = self.in_flight
        self.epochs_served.append(epoch)
        with self.asked:
            self.epoch_asked = epoch
            self.asked.notify_all()
        if self.feed is None:
            # threads of their own wait for Ray Data (the reader), decode and build the labels while this one trains:
            # on one H200 doing it here in turn with the step gave 386 images/s against 1319 in memory
            ahead = ROWS_AHEAD if self.decoder is not None else ROWS_AHEAD_DECODED
            self.reader = Prefetched(self.epoch_rows(epoch), depth=ahead, name="reader").start()
            self.feed = Prefetched(self.epoch_batches(epoch, self.reader), depth=2).start()
        self.feed_clock = clock = self.clock(epoch)
        g = torch.Generator(device=dev)
        g.manual_seed(self.seed * 1_000_003 + epoch * 1009 + self.rank)
        for batch in clock.timed("wait", self.this_epoch()):
            with clock.stage("ring"):
                if self.copy_stream is not None:
                    batch.hand_over(torch.cuda.current_stream(dev))
                slots = self.ring.add(batch)
            self._count_in_flight(-batch.nbytes())
            self.record.write(json.dumps({"epoch": epoch, "ids": batch.ids}) + "\n")
            self.record.flush()
            with torch.profiler.record_function("yolo_ray.augment"), clock.stage("augment"):
                img, targets = augment_batch(self.ring.view(), slots, self.hyp, g)
            size = [(self.ring.imgsz, self.ring.imgsz)] * len(batch.files)
            yield {**targets, "img": img, "im_file": batch.files, "ori_shape": size, "resized_shape": size}

    def this_epoch(self) -> Iterator[Prepared]:
        """The feed's batches up to the end of an epoch (after skipping what is left of any epoch left early)."""
        assert self.feed is not None
        for _ in range(self.ends_owed):
            while (item := next(self.feed)) is not EPOCH_END:
                self._count_in_flight(-item.nbytes())
        self.ends_owed = 1  # until this epoch's end is reached
        while (item := next(self.feed)) is not EPOCH_END:
            yield item
        self.ends_owed = 0

    def clock(self, epoch: int) -> FeedClock:
        """An epoch's clock, shared by the reader, producer and training threads (under `asked`: all three call
        this). Clocks older than the one before the trainer's epoch go: a thread ahead of the trainer (the reader,
        up to ROWS_AHEAD batches, across epochs on a small set) must not drop one still being served."""
        with self.asked:
            for old in [e for e in self.clocks if e < self.epoch_asked - 1]:
                del self.clocks[old]
            return self.clocks.setdefault(epoch, FeedClock())

    def epoch_rows(self, first: int) -> Iterator[dict[str, np.ndarray] | object]:
        """The reader thread: epoch after epoch from `first`, Ray Data's batches of rows then EPOCH_END. It reads up
        to ROWS_AHEAD batches ahead of the decoding, so this epoch's rows are all read, and the next epoch's reading
        starts (Ray Data's shuffle and first read tasks: 0.6 s of a 2.9 s epoch on 3000 images, one H100), while
        those batches are still to be trained on, as Ultralytics' InfiniteDataLoader keeps its workers loading."""
        epoch = first
        # bytes to decode here: Arrow batches, their image bytes one buffer (packed_bytes.py: no Python object an
        # image); pixels decoded by Ray Data: numpy
        fmt = "numpy" if self.decoder is None else "pyarrow"
        while self.may_start(epoch):
            rows = self.shard.iter_batches(
                batch_size=self.batch_size, batch_format=fmt, prefetch_batches=PREFETCH_BATCHES
            )
            if fmt == "pyarrow":
                rows = map(arrow_rows, rows)
            yield from self.clock(epoch).timed("read", rows)
            yield EPOCH_END
            epoch += 1

    def epoch_batches(self, first: int, rows: Iterator[Any]) -> Iterator[Prepared | object]:
        """The producer thread: the reader's rows prepared, epoch after epoch from `first`, each epoch's end passed
        on."""
        epoch = first
        while not self.stopping:  # the reader ends only when closed
            this_epoch = iter(lambda: next(rows), EPOCH_END)  # the reader's rows up to its EPOCH_END
            for batch in self.prepared(this_epoch, self.clock(epoch)):
                self._count_in_flight(batch.nbytes())
                yield batch
            yield EPOCH_END
            epoch += 1

    def may_start(self, epoch: int) -> bool:
        """Whether to read `epoch`: at once if the run has it, else once the trainer asks for it (a run that goes on
        past its planned epochs); False once closed."""
        with self.asked:
            self.asked.wait_for(lambda: epoch < self.epochs or epoch <= self.epoch_asked or self.stopping)
            return not self.stopping

    def prepared(self, rows: Iterator[dict[str, np.ndarray]], clock: FeedClock) -> Iterator[Prepared]:
        """Ray Data's batches, prepared. stream_decode worker: each batch goes to the decoding processes DECODE_AHEAD
        batches before it is finished, so they decode while this thread copies the one before, builds its labels and
        waits for Ray Data."""
        if self.decoder is None or self.decoder.procs is None:
            yield from (self.prepare(r, clock=clock) for r in rows)
            return
        ahead: deque[tuple[dict[str, np.ndarray], Pending]] = deque()
        for r in rows:
            ahead.append((r, self.decoder.submit(r["data"], r["file"])))
            if len(ahead) > DECODE_AHEAD:
                yield self.prepare(*ahead.popleft(), clock)
        while ahead:
            yield self.prepare(*ahead.popleft(), clock)

    def prepare(
        self, rows: dict[str, np.ndarray], pending: Pending | None = None, clock: FeedClock | None = None
    ) -> Prepared:
        """Ray Data's rows -> decoded, resized images on the device and label tensors (the producer thread; pending:
        the rows' images submitted to the decoding processes). On a GPU every copy goes through pinned memory on a
        stream of its own, so it overlaps the training step instead of waiting for it (a copy from pageable memory
        waits for the stream it is on)."""
        side, clock = self.copy_stream, clock or FeedClock()
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), clock.stage("prepare"):
            if self.decoder is None:  # decoded by Ray Data on CPUs
                pixels, sizes = self.upload_pixels(rows["pixels"]), rows["hw"]
            elif pending is not None:  # decoded here, by this rank's OpenCV processes
                with clock.stage("decode"):
                    host, sizes = self.decoder.slots(pending)
                pixels = self.upload(host)
                self.decoder.procs.used(pending, side)  # its shared host batch is free again once this copy is done
            else:  # decoded on the device
                with clock.stage("decode"):
                    pixels, sizes = self.decoder(rows["data"], rows["file"])
            hw = np.asarray(sizes, dtype=np.float32)
            with clock.stage("labels"):  # parsed by Ray Data's tasks (stream_labels.py): one array, one copy
                packed = self.upload(torch.from_numpy(label_batch(rows["labels"], hw)))
                labels = Labels(packed[..., :4], packed[..., 4], packed[..., 5] > 0, None)
            hw = self.upload(torch.from_numpy(hw))
            ready = side.record_event() if side is not None else None
        return Prepared(rows["id"].tolist(), [str(f) for f in rows["file"]], pixels, hw, labels, ready)

    def upload_pixels(self, pixels: np.ndarray) -> torch.Tensor:
        """`upload` for Ray Data's uint8 pixels, a read-only array (its object store): copied, never wrapped, as
        torch warns (on the user's terminal) when it wraps one."""
        if self.copy_stream is None:
            return torch.tensor(pixels, device=self.ring.device)
        host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
        host.numpy()[...] = pixels
        return host.to(self.ring.device, non_blocking=True)

    def upload(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor to the device: through pinned memory (Torch's caching host allocator) without a wait."""
        if self.copy_stream is None:
            return t.to(self.ring.device)
        return t.pin_memory().to(self.ring.device, non_blocking=True)

    def close_mosaic(self) -> None:
        self.hyp.mosaic = 0.0

    def reset(self) -> None:
        pass

    def close(self) -> None:
        """Its threads, decoding processes and shared memory; Ultralytics' trainer calls it once training is over
        (and yolo_ray's tests again: a second call does nothing)."""
        if self.record.closed:
            return
        if self.feed is not None:
            with self.asked:
                self.stopping = True
                self.asked.notify_all()
            self.reader.stop()  # first: the producer, waiting for its rows, then ends
            self.feed.stop()
        self.record.close()
        if self.decoder is not None:
            self.decoder.close()


class Prefetched:
    """Runs an iterator in a daemon thread, `depth` items ahead; its errors surface in the consumer. `stop` stops the
    thread at its next item and ends the consumer's iteration. The thread launches CUDA work on the default stream, as
    the training thread does, so what it queued runs before what the consumer queues after taking the item."""

    _END = object()

    def __init__(self, items: Any, depth: int, name: str = "prefetch"):
        self.items, self.queue = items, queue.Queue(maxsize=depth)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"yolo_ray-stream-{name}", daemon=True)

    def start(self) -> Prefetched:
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the thread, waiting up to `timeout` s for it (a thread blocked inside its iterator is left, a
        daemon)."""
        self.stopped.set()
        deadline = time.monotonic() + timeout
        while self.thread.is_alive() and time.monotonic() < deadline:  # unblock a put on a full queue
            with contextlib.suppress(queue.Empty):
                self.queue.get_nowait()
            self.thread.join(timeout=0.05)

    def _run(self) -> None:
        try:
            for item in self.items:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as e:  # re-raised by the consumer
            self._put(e)

    def _put(self, item: Any) -> bool:
        while not self.stopped.is_set():
            with contextlib.suppress(queue.Full):
                self.queue.put(item, timeout=0.1)
                return True
        return False

    def __iter__(self) -> Prefetched:
        return self

    def __next__(self) -> Any:
        while True:
            with contextlib.suppress(queue.Empty):
                item = self.queue.get(timeout=0.1)
                break
            if self.stopped.is_set():
                raise StopIteration
        if item is self._END:
            self.queue.put(item)  # ended for good
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every served batch of every rank and attempt: {rank, attempt (pid), epoch, ids} in the order written."""
    out = []
    for f in sorted(layout.stream_records(run_dir).glob("rank*.jsonl")):
        rank, pid = f.stem.removeprefix("rank").split(".")
        out += [{"rank": int(rank), "attempt": int(pid), **json.loads(line)} for line in f.read_text().splitlines()]
    return out

"""stream_decode worker: the Train worker's own decoding processes. Threads could not do it: each image's OpenCV and
numpy calls release and retake the GIL several times, and a thread retaking it while another runs Python waits up to
the switch interval (5 ms). On this repo's 2-CPU machine one decoding thread beside a thread running Python went from
395 to 37 images/s (`python benchmarks/decode_gil_probe.py DIR`); on an H100 host 13 threads in the Train worker fed
557-569 images/s while the in-memory path trained at 1058. Processes share no GIL: a batch's compressed bytes (~130 KB
an image) are copied once into a shared input buffer (packed_bytes.py: no pickling, no Python object an image), and
each process writes its images, decoded, resized and padded, straight into a host batch in shared memory that the
training process copies to the GPU. They are spawned, not forked (a forked copy of a Ray worker, its gRPC
threads included, hung), and import numpy and OpenCV only (image_decode.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from multiprocessing import get_context, shared_memory
from typing import NamedTuple

import numpy as np
import torch

from yolo_ray.data import image_decode
from yolo_ray.data.packed_bytes import PackedBytes

INPUT_BYTES_PER_IMAGE = 192 * 1024  # a shared input buffer's first size, per image (real-shaped JPEGs: ~130 KB); grows
# Beside a GPU the decoders have slack (the training thread waited 0.005 s an epoch for batches) and the training
# thread is the critical path, so they yield a shared CPU to it. On an H200, 10 000 images, epochs 2-3: 981 images/s
# at niceness 10 against 956 at 0 (+2.6%, one pair of runs, not repeated in the other order;
# benchmarks/results/2026-12-07-h200-stream-decode-niceness.json).
# On a CPU device training takes every core and the decoders would starve there, so they stay at 0.
GPU_DECODE_NICENESS = 10


class Pending(NamedTuple):
    """A batch being decoded: its shared batch, its size, its chunks' jobs."""

    k: int
    images: int
    jobs: list[Future]


class DecodePool:
    """`processes` decoding processes writing into `depth` host batches of [batch, imgsz, imgsz, 3] uint8 in shared
    memory, used in turn. `submit` returns at once and `result` waits, so the next batch decodes while its caller
    finishes the one before. On a GPU the batches are page-locked (one copy to the device, without a wait) and a batch
    is written again only once its last copy to the device is done (`used`)."""

    def __init__(self, imgsz: int, batch: int, processes: int, depth: int, device: torch.device,
                 input_bytes_per_image: int = INPUT_BYTES_PER_IMAGE):  # fmt: skip
        self.processes, self.depth, self.next = max(1, processes), depth, 0
        shape = (depth, max(1, batch), imgsz, imgsz, 3)
        self.input_bytes = max(1, batch) * input_bytes_per_image
        check_shared_memory(int(np.prod(shape)) + depth * self.input_bytes, batch, imgsz)
        self.shm = shared_memory.SharedMemory(create=True, size=int(np.prod(shape)))
        self.inputs: list[shared_memory.SharedMemory | None] = [None] * depth  # each batch's compressed bytes
        self.batches = np.ndarray(shape, np.uint8, buffer=self.shm.buf)
        self.pinned = device.type == "cuda" and self._pin(self.batches)
        self.copied: list[torch.cuda.Event | None] = [None] * depth
        self.jobs: list[list[Future]] = [[] for _ in range(depth)]  # each shared batch's last writers
        self.pool = ProcessPoolExecutor(
            self.processes,
            get_context("spawn"),
            initializer=image_decode.attach,
            initargs=(self.shm.name, shape, GPU_DECODE_NICENESS if device.type == "cuda" else 0),
        )

    @staticmethod
    def _pin(batches: np.ndarray) -> bool:
        """Page-locks the shared batches for asynchronous copies; False (pageable copies) if CUDA refuses."""
        return int(torch.cuda.cudart().cudaHostRegister(batches.ctypes.data, batches.nbytes, 0)) == 0

    def submit(self, data: PackedBytes | Sequence[bytes], files: Sequence[str]) -> Pending:
        """A batch of image bytes to the processes, in the next shared batch; returns at once, so the caller can
        hand over the batch before (its copy, its labels) while they decode this one."""
        k, self.next = self.next, (self.next + 1) % self.depth
        wait(self.jobs[k])  # a batch left behind (an epoch cut short) is still being written
        if self.copied[k] is not None:
            self.copied[k].synchronize()  # the batch it held before has reached the device
        packed = PackedBytes.of(data)
        source = self._stage(k, packed.span())
        ends = (packed.offsets - packed.offsets[0]).tolist()
        chunks = [c.tolist() for c in np.array_split(np.arange(len(packed)), self.processes) if len(c)]
        jobs = [
            self.pool.submit(
                image_decode.decode_chunk, k, c, source, [(ends[i], ends[i + 1]) for i in c], [str(files[i]) for i in c]
            )
            for c in chunks
        ]
        self.jobs[k] = jobs
        return Pending(k, len(packed), jobs)

    def _stage(self, k: int, span: np.ndarray) -> str:
        """A batch's bytes into shared input buffer k (made larger where they do not fit); its name."""
        shm = self.inputs[k]
        if shm is None or shm.size < len(span):
            if shm is not None:  # its last readers are done (submit waited for them)
                shm.close()
                shm.unlink()
            size = max(self.input_bytes, len(span) * 3 // 2)
            shm = self.inputs[k] = shared_memory.SharedMemory(create=True, size=size)
        np.frombuffer(shm.buf, np.uint8, count=len(span))[:] = span
        return shm.name

    def result(self, p: Pending) -> tuple[torch.Tensor, np.ndarray]:
        """A submitted batch, decoded: ([B, imgsz, imgsz, 3] host tensor, (h, w) of each). On a GPU the tensor is
        the shared batch itself: call `used` once its copy is queued. On a CPU it is a copy of its own."""
        hw = [s for j in p.jobs for s in j.result()]
        out = torch.from_numpy(self.batches[p.k, : p.images])
        return (out if self.pinned else out.clone()), np.array(hw, dtype=np.int32).reshape(-1, 2)

    def decode(self, data: np.ndarray, files: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """submit, then result: one batch at a time."""
        return self.result(self.submit(data, files))

    def used(self, p: Pending, stream: torch.cuda.Stream | None) -> None:
        """Batch p's copy to the device is queued on `stream`: its shared batch waits for it."""
        if self.pinned and stream is not None:
            self.copied[p.k] = stream.record_event()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.pinned:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self.batches.ctypes.data)
        del self.batches
        for shm in [self.shm, *(s for s in self.inputs if s is not None)]:
            with contextlib.suppress(BufferError):  # a tensor over it still alive: the mapping goes with the process
                shm.close()
            shm.unlink()


SHM_DIR = "/dev/shm"  # where Python's SharedMemory (shm_open) puts its files on Linux


def check_shared_memory(need: int, batch: int, imgsz: int, where: str = SHM_DIR) -> None:
    """Fails before any decoding if the shared batches do not fit in `where`: a container's /dev/shm is 64 MB unless
    set larger, and a shared batch written past it kills the decoding process with SIGBUS, mid-epoch, on every retry.
    """
    if not os.path.isdir(where):
        return
    free = shutil.disk_usage(where).free
    if need > free:
        raise RuntimeError(
            f"data.stream_decode=worker: the decoding processes' shared host batches ({batch} images at "
            f"imgsz={imgsz}) need {need / 2**20:.0f} MiB of {where}, but only {free / 2**20:.0f} MiB is free. Fix: "
            "a larger shared memory for the Ray node (docker run --shm-size, or a memory-backed emptyDir on "
            f"{where} as in cluster/kuberay/raycluster.yaml), a lower train.batch, or data.stream_decode: cpu."
        )


def default_processes(cpus: float) -> int:
    """One decoding process per CPU Ray gave the rank, less one for its training thread."""
    return max(1, min(int(cpus) - 1, os.cpu_count() or 1))

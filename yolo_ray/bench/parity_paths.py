"""The paths the parity benchmark compares, in the order its tables list them, and its bar."""

from __future__ import annotations

PATHS = ("native", "ultralytics", "device", "graphs", "throughput", "nativethroughput", "valinline", "valgraphs",
         "valasync", "valthread", "stream", "streamcpu", "streamworker", "streamdevice")  # fmt: skip
DEFAULT_PATHS = PATHS[:5]
# the large-batch paths: throughput mode's batch (throughput_batch_per_gpu) and its LR rule (lr0 linear in the batch)
LARGE_BATCH = ("throughput", "nativethroughput")
# a path compared also with plain Ultralytics at its own batch and LR: what the path costs, apart from the batch's cost
SAME_BATCH_NATIVE = {"throughput": "nativethroughput"}
# the fast path validating every epoch (the others validate once, at the end): inline, or by its own actor on a
# quarter of the GPU (train.val_async, worker/async_val.py): what validation costs the training GPU's epoch
VALIDATING = {
    "valinline": [],
    "valgraphs": ["train.val_cuda_graphs=true"],  # inline, its forward replayed as CUDA graphs (worker/val_graphs.py)
    "valasync": ["train.val_async=true", "train.val_runner=actor"],  # a Ray actor
    "valthread": ["train.val_async=true", "train.val_runner=thread"],  # rank 0's process, a CUDA stream of its own
}
SHARED_GPU = ["train.val_gpus=0.25", "scaling.gpus_per_worker=0.75"]  # valasync on a GPU: a quarter of it validates
VAL_CPUS = 3  # the validation actor's CPUs (its val loader's processes), taken from the training worker's
PARITY_POINTS = 0.005  # a path is at parity when its mean mAP50-95 >= native's mean - this

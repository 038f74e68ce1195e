"""The one rule for how the global batch is split across Ray workers, whatever the group's size right now.

`train.batch` is global and `train.accumulate` steps the optimizer every k batches: an optimizer step sees
`batch * accumulate` images. A fixed group of n workers gives each `batch / n` images a step. An elastic group
(`scaling.num_workers: [min, max]`) restarts at another size when nodes come or go, and the images per optimizer step
must not move with it (nor the learning rate, which therefore stays as it is): a worker never takes more images a step
than it does at full size (what its GPU memory was sized for), and accumulation makes up the rest. Where the numbers
do not divide, the step gets the nearest count at or below `batch * accumulate` (e.g. 64 on 3 workers sized for 4:
10 images x 3 workers x 2 steps = 60).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerBatch:
    per_worker: int  # images a worker takes each step
    accumulate: int  # steps per optimizer step
    world: int

    @property
    def per_step(self) -> int:
        """Images one optimizer step sees, over all workers."""
        return self.per_worker * self.accumulate * self.world

    def ultralytics(self) -> dict[str, int]:
        """Ultralytics' arguments for it: its `batch` is global (it divides by the world size) and its accumulation
        is round(nbs / batch)."""
        return {"batch": self.per_worker * self.world, "nbs": self.per_step}


def plan(batch: int, accumulate: int, world: int, max_world: int) -> WorkerBatch:
    """Per-worker batch and accumulation at `world` workers for a run sized for `max_world` (fixed runs: equal).
    (`train.accumulate: null`, Ultralytics' own rule, is for fixed groups only: the config says so.)"""
    per_step = batch * accumulate
    full = math.ceil(batch / max_world)  # a worker's images a step at full size
    steps = math.ceil(per_step / (world * full))
    return WorkerBatch(max(1, per_step // (world * steps)), steps, world)

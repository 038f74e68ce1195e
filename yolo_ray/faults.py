"""Fault injection: make one rank raise right after a chosen epoch's checkpoint (or `batch` batches into the next
epoch: a failure mid-epoch), on the first attempt only.

Set `run.fail_at_epoch` / `run.fail_rank` / `run.fail_at_batch` in the config, or YOLO_RAY_FAIL_AT="EPOCH[:RANK]"
in the environment.
After the failure Ray restarts the worker group, which resumes from that epoch's checkpoint and so never fails again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_VAR = "YOLO_RAY_FAIL_AT"


class InjectedFault(RuntimeError):
    """Raised on purpose to prove recovery."""


@dataclass(frozen=True)
class FaultPlan:
    epoch: int | None = None  # 1-based epoch after whose checkpoint the rank fails
    rank: int = 0
    batch: int | None = None  # fail after this many batches of epoch + 1 instead of at its start

    def or_env(self) -> FaultPlan:
        """The plan YOLO_RAY_FAIL_AT="EPOCH[:RANK]" in this process's environment sets, else this one (the config's:
        the driver's WorkerPlan)."""
        env = os.environ.get(ENV_VAR)
        if not env:
            return self
        epoch, _, rank = env.partition(":")
        return FaultPlan(int(epoch), int(rank or 0))

    def due(self, epoch_about_to_start: int, resumed_from: int | None) -> bool:
        """Whether the planned failure comes now (on its rank): at the start of the epoch after `epoch`, on the
        attempt that got past it (a resumed attempt already resumed from the checkpoint the failure was meant to
        test)."""
        if self.epoch is None or epoch_about_to_start != self.epoch + 1:
            return False
        return resumed_from is None or resumed_from < self.epoch

    def maybe_fail(
        self, rank: int, epoch_about_to_start: int, resumed_from: int | None, batches_done: int | None = None
    ) -> None:
        """Called at the start of every epoch (1-based; batches_done None) and after each batch (batches_done: of
        that epoch); fails once, on the attempt that got past `epoch`."""
        if rank != self.rank or batches_done != self.batch or not self.due(epoch_about_to_start, resumed_from):
            return
        where = f"epoch {self.epoch}'s checkpoint"
        if self.batch:
            where = f"{batches_done} batches into epoch {self.epoch + 1}"
        raise InjectedFault(f"yolo_ray fault injection: rank {rank} fails after {where}")

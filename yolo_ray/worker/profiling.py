"""Where a training step's time goes: torch.profiler over a few steps of one epoch on rank 0.

`run.profile_steps: N` profiles N batches of the second epoch (past cuDNN autotuning and the first-epoch one-offs)
and writes, in the run directory:
- profile.txt: the top ops by self device time (self CPU time on CPU runs);
- profile.json: wall ms per step, device-busy ms per step, and the ms per step inside yolo_ray's named ranges
  (`yolo_ray.augment`: the device loader's batch augmentation). A step whose device-busy time is far below its wall
  time is bound by the host (Python, kernel launches, syncs), not by the GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from yolo_ray.console import say

RANGES = ("yolo_ray.augment",)


class StepProfiler:
    """Ultralytics callbacks that run torch.profiler over `steps` batches of epoch index `epoch` (0-based)."""

    def __init__(self, run_dir: Path, steps: int, epoch: int = 1, skip: int = 2):
        self.run_dir, self.steps, self.epoch, self.skip = run_dir, steps, epoch, skip
        self.prof: torch.profiler.profile | None = None
        self.seen = 0
        self.t0 = 0.0
        self.done = False

    def attach(self, trainer: Any) -> None:
        trainer.add_callback("on_train_batch_end", self.on_batch_end)
        trainer.add_callback("on_train_epoch_end", self.on_epoch_end)

    def on_epoch_end(self, trainer: Any) -> None:
        """An epoch shorter than the window: keep the steps it had."""
        if self.prof is not None and not self.done and self.seen > self.skip:
            self._finish(trainer, self.seen - self.skip)

    def on_batch_end(self, trainer: Any) -> None:
        """The window runs from one batch end to the N-th next: N batch fetches (augmentation) and N steps."""
        if self.done or trainer.epoch != min(self.epoch, trainer.epochs - 1):
            return
        self.seen += 1
        if self.prof is None:
            if self.seen == self.skip:
                self._start(trainer)
            return
        if self.seen - self.skip >= self.steps:
            self._finish(trainer, self.steps)

    def _finish(self, trainer: Any, steps: int) -> None:
        _sync(trainer.device)
        wall_ms = (time.perf_counter() - self.t0) * 1000
        self.prof.__exit__(None, None, None)
        self.done = True
        self._write(trainer, wall_ms, steps)

    def _start(self, trainer: Any) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if trainer.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        _sync(trainer.device)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.__enter__()
        self.t0 = time.perf_counter()

    def _write(self, trainer: Any, wall_ms: float, n: int) -> None:
        on_cuda = trainer.device.type == "cuda"
        averages = self.prof.key_averages()
        sort = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
        (self.run_dir / "profile.txt").write_text(averages.table(sort_by=sort, row_limit=40))
        summary = {
            "steps": n,
            "batch_per_worker": trainer.batch_size // max(trainer.world_size, 1),
            "device": str(trainer.device),
            "wall_ms_per_step": round(wall_ms / n, 2),
            "device_busy_ms_per_step": round(_device_busy_us(self.prof) / 1000 / n, 2) if on_cuda else None,
        }
        for name in RANGES:
            row = next((e for e in averages if e.key == name), None)
            summary[f"{name}_cpu_ms_per_step"] = round(row.cpu_time_total / 1000 / n, 2) if row else None
            if on_cuda and row is not None:
                summary[f"{name}_device_ms_per_step"] = round(_device_time(row) / 1000 / n, 2)
        (self.run_dir / "profile.json").write_text(json.dumps(summary, indent=2))
        say(f"[yolo_ray] profile of {n} steps: {json.dumps(summary)}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_time(evt: Any, prefix: str = "") -> float:
    """An event's device time in us (`device_*` in recent torch, `cuda_*` before)."""
    return float(getattr(evt, f"{prefix}device_time_total", None) or getattr(evt, f"{prefix}cuda_time_total", 0.0))


def _device_busy_us(prof: torch.profiler.profile) -> float:
    """What the GPU actually computed: the self time of device-side events (kernels, copies), as torch's own table
    totals it; CPU ops (whose self device time repeats their kernels') and user ranges are left out."""
    from torch.autograd import DeviceType

    return sum(
        _device_time(evt, "self_")
        for evt in prof.key_averages()
        if evt.device_type == DeviceType.CUDA and not getattr(evt, "is_user_annotation", False)
    )

"""Gradient clipping at train.grad_clip, and each step's gradient norm before it, summarised once an epoch.

Ultralytics' optimizer_step clips the unscaled gradients to a norm of 10.0 (fixed) and drops the norm that
`torch.nn.utils.clip_grad_norm_` returns. Its loss is a sum over the batch's images, so the gradient norm grows with
the images per step; on the parity data YOLO11n's norms were 270-3600 at 64 images and at 256, so every step was
clipped and a step's length is lr x the limit (README, Batch, accumulation and learning rate).
`GradNorms.clipping()` wraps that one call for the length of an optimizer step: it clips at the configured norm
(0: not at all) and keeps the norm on the device, so a step never waits for it; `epoch_summary` reads them all at
the epoch's end (one synchronisation an epoch).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from yolo_ray.config_schema import ULTRALYTICS_GRAD_CLIP


class GradNorms:
    def __init__(self, max_norm: float = ULTRALYTICS_GRAD_CLIP):
        self.max_norm = float(max_norm) if max_norm else math.inf  # 0: measured, never clipped
        self.norms: list[torch.Tensor] = []

    @contextlib.contextmanager
    def clipping(self) -> Iterator[None]:
        """Within: torch.nn.utils.clip_grad_norm_ clips at max_norm whatever limit its caller passed, and keeps the
        norm it returns (the total before clipping)."""
        utils = torch.nn.utils
        original = utils.clip_grad_norm_

        def clip(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
            norm = original(parameters, self.max_norm, *args, **kwargs)
            self.norms.append(norm.detach())
            return norm

        utils.clip_grad_norm_ = clip
        try:
            yield
        finally:
            utils.clip_grad_norm_ = original

    def reset(self) -> None:
        """Forget the steps so far (an epoch's start: ranks other than 0 never read theirs)."""
        self.norms.clear()

    def epoch_summary(self) -> dict[str, float]:
        """The epoch's steps: mean and largest gradient norm before clipping, and the share of steps clipped.
        Steps whose gradients overflowed under AMP (the scaler skips them) are left out. Clears the record."""
        if not self.norms:
            return {}
        norms = torch.stack([n.float().reshape(()) for n in self.norms]).cpu()
        self.reset()
        finite = norms[torch.isfinite(norms)]
        if finite.numel() == 0:
            return {"grad_norm_steps": 0}
        return {
            "grad_norm_mean": float(finite.mean()),
            "grad_norm_max": float(finite.max()),
            "grad_clipped_share": float((finite > self.max_norm).float().mean()),
            "grad_norm_steps": int(finite.numel()),
        }

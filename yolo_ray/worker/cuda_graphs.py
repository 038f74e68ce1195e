"""CUDA graphs for a detection model's training forward and backward.

A small model at 64 images per GPU can be bound by the host issuing its many small kernels rather than by the GPU,
more so with two processes coupled by DDP (benchmarks/step_probe.py measures it): as graphs, the model's forward and
backward are one replay each. The loss (target assignment, with data-dependent shapes and host syncs) stays eager.

`GraphedModel` keeps the contract of torch.compile's wrapper (the model under `_orig_mod`), which is the seam
Ultralytics' trainer has for compiled models: it calls `self.model(img)` for the predictions and
`unwrap_model(self.model).loss(batch, preds)`, and everything else (EMA, saving, the criterion) unwraps the model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _Predict(nn.Module):
    """The graphed callable: an image batch to the head's raw training outputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, img: torch.Tensor) -> Any:
        return self.model.predict(img)


class GraphedModel(nn.Module):
    """Replays CUDA graphs for training batches shaped like the captured one; anything else runs the model eagerly
    (the last, smaller batch of an epoch, eval mode, dict inputs, CPU).

    Capture before DDP wraps the model (`capture`): DDP holds the parameters' gradient accumulators on the default
    stream, and a capture on a side stream that reaches them fails. Without DDP the first training batch is captured
    on the fly. The capture's warm-up steps leave parameters and BatchNorm statistics as they were.
    """

    def __init__(self, model: nn.Module, warmup_steps: int = 3):
        super().__init__()
        self._orig_mod = model
        self.warmup_steps = warmup_steps
        # outside the module tree: the graphed callable's parameters are the model's own
        self.__dict__["_graphed"] = None
        self.__dict__["_key"] = None

    def __getattr__(self, name: str) -> Any:  # the model's attributes (stride, names, args), as torch.compile's wrapper
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_orig_mod":
                raise
            return getattr(self._orig_mod, name)

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not self._graphable(x):
            return self._orig_mod(x, *args, **kwargs)
        amp = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        if self._graphed is None:
            self.capture(x, amp)
        return self._graphed(x) if self._input_key(x, amp) == self._key else self._orig_mod(x)

    def _graphable(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.is_cuda and self._orig_mod.training and torch.is_grad_enabled()

    @staticmethod
    def _input_key(x: torch.Tensor, amp: torch.dtype | None) -> tuple:
        return x.shape, x.dtype, amp  # any memory layout: replays copy the batch into the captured input

    def capture(self, sample: torch.Tensor, amp: torch.dtype | None) -> GraphedModel:
        """Record the forward and backward graphs for batches shaped like `sample`, under autocast to `amp`."""
        model = self._orig_mod
        saved = [b.detach().clone() for b in model.buffers()]  # warm-up steps update BatchNorm's statistics
        # captured graphs cannot use autocast's weight cache; replays run whatever was captured
        with torch.autocast("cuda", dtype=amp or torch.float16, enabled=amp is not None, cache_enabled=False):
            graphed = torch.cuda.make_graphed_callables(
                _Predict(model), (sample.detach().clone(),), num_warmup_iters=self.warmup_steps
            )
        with torch.no_grad():
            for b, v in zip(model.buffers(), saved, strict=True):
                b.copy_(v)
        self.__dict__["_graphed"], self.__dict__["_key"] = graphed, self._input_key(sample, amp)
        return self

"""CUDA graphs for a detection model's training forward and backward.

A small model at 64 images per GPU is bound by the host issuing its ~2,000 kernels a step, not by the GPU
(benchmarks/step_probe.py measures it): as graphs, the model's forward and backward are two replays each. The loss
(target assignment with data-dependent shapes and host syncs) stays eager.

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
    """Replays CUDA graphs for training batches of the shape first seen; anything else runs the model eagerly
    (the last, smaller batch of an epoch, eval mode, dict inputs, CPU).

    The capture runs a few warm-up steps on that first batch (as torch.cuda.make_graphed_callables does), which
    moves BatchNorm's running statistics by those extra updates; parameters are untouched.
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
        key = self._input_key(x)
        if self._graphed is None:
            self._capture(x, key)
        return self._graphed(x) if key == self._key else self._orig_mod(x)

    def _graphable(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.is_cuda and self._orig_mod.training and torch.is_grad_enabled()

    @staticmethod
    def _input_key(x: torch.Tensor) -> tuple:
        amp = torch.is_autocast_enabled("cuda")
        return x.shape, x.stride(), x.dtype, amp, amp and torch.get_autocast_dtype("cuda")

    def _capture(self, x: torch.Tensor, key: tuple) -> None:
        amp, dtype = key[3], key[4] or torch.float16
        # captured graphs cannot use autocast's weight cache; replays run whatever was captured
        with torch.autocast("cuda", dtype=dtype, enabled=amp, cache_enabled=False):
            graphed = torch.cuda.make_graphed_callables(
                _Predict(self._orig_mod), (x.detach().clone(),), num_warmup_iters=self.warmup_steps
            )
        self.__dict__["_graphed"], self.__dict__["_key"] = graphed, key

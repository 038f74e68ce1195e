"""CUDA graphs for validation's forward pass on a GPU (train.val_cuda_graphs): inline, or in val_async's validator.

Validating YOLO11n's 600 val images on an H100 took ~0.28 s an epoch, ~0.16 s of it the forward pass: ~0.26 ms an
image at 32 images a batch, a few times what its arithmetic needs, so the host's launches of a few hundred small
kernels a batch set the pace (README, "Validation inline or off the critical path"). A graph replays a batch's
forward as one launch.

The model replayed is the live EMA itself: Ultralytics updates its tensors in place (a lerp each step) and validates
it in fp32 under autocast, so a graph captured once computes with the current weights on every replay (the casts to
fp16 are captured as kernels, autocast's weight cache off). Val batches keep their shapes from epoch to epoch (the kept
batches of val_batches.py), so each shape is run eagerly the first time it is seen (its cuDNN plans, the allocator's
blocks), captured the second and replayed from then on; the same kernels on the same inputs give the same numbers.
Every graph shares one memory pool (they never run at once) and each replay's outputs are cloned before the next.
An Ultralytics that casts the EMA to fp16 for each validation (8.3) gives it new tensors every time: the graphs are
dropped each time, and validation stays eager. val_async's validator (worker/async_val.py) loads each epoch's weights
into its model's own tensors, which the graphs read as they read the live EMA's. There the saving is also the GIL's:
on the `thread` runner, an eager forward's launches contend with the training thread's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from yolo_ray.console import say


class _Captured:
    """One input shape's graph, its static input and its static outputs."""

    def __init__(self, graph: torch.cuda.CUDAGraph, x: torch.Tensor, out: Any, anchors: list[torch.Tensor]):
        self.graph, self.x, self.out = graph, x, out
        self.anchors = anchors  # the heads' anchors it reads, kept alive when the heads make another shape's

    def __call__(self, x: torch.Tensor) -> Any:
        self.x.copy_(x)
        self.graph.replay()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.out)


class EvalGraphs:
    """Replays CUDA graphs of a model's eval forward, one per input (shape, dtype, layout, autocast dtype). Anything
    it cannot replay runs eagerly: training mode, grad enabled, a CPU tensor, extra arguments (augment=True). Another
    model, or the same one with any tensor elsewhere than at the capture (a resumed or repaired EMA, a cast), drops
    the graphs: they are captured again."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.tensors: tuple[int, ...] = ()  # where the model's tensors were when the graphs were captured
        self.checked = False  # whether they were compared in this validation
        self.graphs: dict[tuple, _Captured] = {}
        self.seen: set[tuple] = set()
        self.pool: Any = None
        self.failed = False

    @contextlib.contextmanager
    def installed(self, model: nn.Module) -> Iterator[EvalGraphs]:
        """While open, calls of `model` (as the validator makes them) go through `forward`."""
        if model is not self.model:
            self.model, self.tensors = model, ()
            self.graphs.clear(), self.seen.clear()
        self.checked = False
        model.forward = self.forward  # an instance attribute: nn.Module.__call__ finds it before the class's
        try:
            yield self
        finally:
            del model.forward
            _forget_anchor_shapes(model)  # an eager call after this computes its own anchors

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.model is not None
        eager = type(self.model).forward.__get__(self.model)
        if self.failed or args or any(kwargs.values()) or not self._graphable(x):
            return eager(x, *args, **kwargs)
        if not self.checked:  # at the first call, after whatever the validator did to the model (a cast)
            self.checked = True
            tensors = _tensor_addresses(self.model)
            if tensors != self.tensors:  # not the tensors the graphs read: they go
                self.tensors = tensors
                self.graphs.clear(), self.seen.clear()
        amp = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        key = (tuple(x.shape), x.dtype, x.stride(), amp)
        if key in self.graphs:
            return self.graphs[key](x)
        if key not in self.seen:  # first sight: eagerly, as before (plans, blocks), then captured next time
            self.seen.add(key)
            return eager(x)
        try:
            self.graphs[key] = self._capture(x, amp, eager)
        except Exception as e:  # noqa: BLE001 - an optimisation: validation goes on eagerly, with the same numbers
            self.failed = True
            say(f"[yolo_ray] validation's CUDA graphs failed ({type(e).__name__}: {e}); validating eagerly")
            _forget_anchor_shapes(self.model)
            return eager(x)
        return self.graphs[key](x)

    def _graphable(self, x: Any) -> bool:
        assert self.model is not None
        return isinstance(x, torch.Tensor) and x.is_cuda and not self.model.training and not torch.is_grad_enabled()

    def _capture(self, x: torch.Tensor, amp: torch.dtype | None, eager: Any) -> _Captured:
        assert self.model is not None
        static = x.clone()  # keeps x's layout (channels_last)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()

        # a captured graph cannot use autocast's weight cache (it would keep the first weights' fp16 copies)
        def autocast() -> Any:
            return torch.autocast("cuda", dtype=amp or torch.float16, enabled=amp is not None, cache_enabled=False)

        # the heads make a shape's anchors from CPU aranges copied to the GPU, which a capture refuses (Ultralytics
        # 8.4.190's make_anchors; seen on an H100): made once eagerly here, and the graph reads them as they are
        _forget_anchor_shapes(self.model)
        with autocast():
            eager(static)
        anchors = _anchor_tensors(self.model)
        # captured on this thread alone (the training thread may hold graphs of its own)
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), autocast():
            out = eager(static)
        return _Captured(graph, static, out, anchors)


def _tensor_addresses(model: nn.Module) -> tuple[int, ...]:
    """Where every tensor a graph of the forward reads lives: parameters, buffers and the heads' strides (a plain
    attribute, which Ultralytics' model casts with the rest)."""
    strides = [m.stride for m in model.modules() if hasattr(m, "anchors") and torch.is_tensor(getattr(m, "stride", 0))]
    return tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers(), *strides))


def _anchor_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The heads' anchors and strides for the shape they last saw."""
    return [t for m in model.modules() if hasattr(m, "anchors") for t in (m.anchors, getattr(m, "strides", None))
            if torch.is_tensor(t)]  # fmt: skip


def _forget_anchor_shapes(model: nn.Module) -> None:
    """Ultralytics' heads keep their anchors for the last input shape (`shape`, `shapes`) and make them again only
    when it changes. Forgotten before a capture, so the eager call just before it makes that shape's (which the
    graph then reads), and when validation ends, so the model leaves it as it found it."""
    for m in model.modules():
        if hasattr(m, "anchors"):
            for attr in ("shape", "shapes"):
                if hasattr(m, attr):
                    setattr(m, attr, None)

"""Inline validation on a thread of its own, whose cuDNN plans for the val shapes are built beside training.

cuDNN builds an execution plan the first time a thread meets a convolution of a new (input shape, memory layout);
PyTorch keeps the plans per thread. YOLO11n's val split has several rect batch shapes, ~1-2.5 s of plan building
each on an H200 (benchmarks/conv_first_call_probe.py): 5-10 s on every rank's critical path at the first
validation (the last epoch's, with train.val=false). Here every inline validation of a GPU run (each epoch's and
final_eval's) runs on one long-lived thread, and when training starts that thread runs a copy of the model over the
val batches on a side stream while the training thread trains: the plans, and the val batches kept on the GPU
(worker/val_batches.py), are ready by the first validation.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch
from torch import nn

from yolo_ray.console import say

T = TypeVar("T")


class InlineValThread:
    """One thread that runs every validation of this worker, warmed once by `warm`."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="yolo_ray-val")
        self.ident = self._pool.submit(self._set_up).result()
        self._warming: Future | None = None
        self.warm_s: float | None = None  # how long the warm pass took (on its thread)
        self.waited_s = 0.0  # how long validation waited for it (on the training thread)

    def warm(self, model: nn.Module, batches: Iterable[dict[str, Any]], half: bool,
             then: Callable[[], object] | None = None) -> None:  # fmt: skip
        """Start `model` (a copy: its weights do not matter, its layout does) over every val batch, as the validator
        feeds them (uint8 images scaled to [0, 1], fp16 under autocast when training used AMP); then `then()` (more
        of validation's first-call work, e.g. compiling its NMS kernel), on the same side stream."""
        self._warming = self._pool.submit(self._forward_all, model, batches, half, then)

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on the validation thread, once the warm pass is done; its result or exception here."""
        if threading.get_ident() == self.ident:  # already on it (a validation that validates): no wait on itself
            return fn(*args, **kwargs)
        self._join_warm()
        if self.device.type != "cuda":
            return self._pool.submit(fn, *args, **kwargs).result()
        # the caller's stream need not be the legacy default one (which orders every blocking stream): order
        # validation after what the caller queued, and the caller after what validation queued
        queued = torch.cuda.current_stream(self.device).record_event()
        result, done = self._pool.submit(self._after, queued, fn, *args, **kwargs).result()
        torch.cuda.current_stream(self.device).wait_event(done)
        return result

    def _after(self, queued: torch.cuda.Event, fn: Callable[..., T], *args: Any,
               **kwargs: Any) -> tuple[T, torch.cuda.Event]:  # fmt: skip
        torch.cuda.current_stream(self.device).wait_event(queued)
        result = fn(*args, **kwargs)
        return result, torch.cuda.current_stream(self.device).record_event()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _join_warm(self) -> None:
        if self._warming is None:
            return
        started, warming, self._warming = time.perf_counter(), self._warming, None
        try:
            warming.result()
        except Exception as e:  # only a head start: validation itself builds what the warm pass did not
            say(f"[yolo_ray] warming validation failed ({type(e).__name__}: {e}); validating without it")
        self.waited_s = time.perf_counter() - started

    def _set_up(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is per thread
        return threading.get_ident()

    def _forward_all(self, model: nn.Module, batches: Iterable[dict[str, Any]], half: bool,
                     then: Callable[[], object] | None) -> None:  # fmt: skip
        started, cuda = time.perf_counter(), self.device.type == "cuda"
        side = torch.cuda.Stream(self.device) if cuda else None  # beside training's kernels, not queued behind them
        on_side = (lambda: torch.cuda.stream(side)) if side is not None else contextlib.nullcontext
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.float16, enabled=half and cuda):
            for batch in batches:  # the kept val batches are made on this thread's default stream
                img = batch["img"].to(self.device, non_blocking=cuda)
                if side is not None:
                    side.wait_stream(torch.cuda.current_stream(self.device))
                with on_side():
                    model((img.half() if half and cuda else img.float()) / 255)
        if then is not None:
            with on_side():
                then()
        if side is not None:
            side.synchronize()
        self.warm_s = time.perf_counter() - started


class OnInlineValThread:
    """A validator whose calls run on `thread` (final_eval calls trainer.validator directly); everything else is the
    validator's."""

    def __init__(self, validator: Any, thread: InlineValThread):
        self.__dict__.update(validator=validator, thread=thread)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.thread.run(self.validator, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["validator"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.validator, name, value)

"""Inline validation's own thread (worker/inline_val_thread.py): the warm pass and every validation run on one
thread (PyTorch keeps cuDNN's plans per thread), a failed warm pass costs nothing but its head start."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from yolo_ray.worker.inline_val_thread import InlineValThread, OnInlineValThread


class _Recorder(nn.Module):
    """A model that records the thread, shape and value range of every input."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.fail, self.seen = fail, []

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("no plan for this shape")
        self.seen.append((threading.get_ident(), tuple(img.shape), float(img.max())))
        return img.mean()


def _batches() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 3, 64, 48), (4, 3, 48, 64), (2, 3, 64, 64)]  # rect batches of several shapes
    return [{"img": torch.randint(0, 256, s, dtype=torch.uint8, generator=g), "im_file": ["x"] * s[0]} for s in shapes]


def test_warm_pass_and_every_validation_run_on_one_thread() -> None:
    thread, model, batches = InlineValThread(torch.device("cpu")), _Recorder(), _batches()
    try:
        then: list[int] = []  # after the batches (e.g. the NMS kernel's compile): on the thread, once
        thread.warm(model, batches, half=False, then=lambda: then.append(threading.get_ident()))
        idents = {thread.run(threading.get_ident) for _ in range(3)}  # waits for the warm pass first
        assert [s for _, s, _ in model.seen] == [tuple(b["img"].shape) for b in batches]  # every batch, in order
        assert {i for i, _, _ in model.seen} == idents == set(then) == {thread.ident} != {threading.get_ident()}
        assert len(then) == 1
        assert all(0.9 < top <= 1.0 for _, _, top in model.seen)  # images as the validator feeds them: uint8 / 255
        assert thread.warm_s is not None and thread.waited_s >= 0
        assert thread.run(lambda: thread.run(lambda: 7)) == 7  # a validation that validates does not wait on itself
    finally:
        thread.close()


def test_a_failed_warm_pass_does_not_stop_validation(capsys: pytest.CaptureFixture[str]) -> None:
    thread = InlineValThread(torch.device("cpu"))
    try:
        thread.warm(_Recorder(fail=True), _batches(), half=False)
        assert thread.run(lambda x: x + 1, 1) == 2
        assert "warming validation failed (RuntimeError: no plan for this shape)" in capsys.readouterr().out
        with pytest.raises(ZeroDivisionError):  # validation's own errors reach the training thread
            thread.run(lambda: 1 / 0)
    finally:
        thread.close()


class _Validator:
    def __init__(self) -> None:
        self.args, self.calls = SimpleNamespace(plots=True), []

    def __call__(self, **kwargs: object) -> int:
        self.calls.append(kwargs)
        return threading.get_ident()


def test_final_evals_validator_is_called_on_the_thread() -> None:
    thread, validator = InlineValThread(torch.device("cpu")), _Validator()
    try:
        proxy = OnInlineValThread(validator, thread)
        proxy.args.plots = False  # what final_eval sets on it
        proxy.metrics = {"x": 1}
        assert proxy(model="best.pt") == thread.ident
        assert validator.calls == [{"model": "best.pt"}] and validator.metrics == {"x": 1}
        assert validator.args.plots is False
    finally:
        thread.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams")
def test_validation_is_ordered_with_a_training_stream_that_is_not_the_default() -> None:
    """Training on a stream of its own (not the legacy default stream, which orders every other): validation still
    reads what training queued before it, and training what validation queued."""
    device = torch.device("cuda", torch.cuda.current_device())
    thread, x = InlineValThread(device), torch.zeros(1 << 20, device=device)
    training = torch.cuda.Stream(device, priority=-1)

    def late_write(value: float) -> None:
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU clock before the write lands
        x.fill_(value)

    try:
        with torch.cuda.stream(training):
            late_write(1.0)
            assert thread.run(lambda: float(x.min())) == 1.0  # validation waited for training's write
            thread.run(late_write, 2.0)
            assert float(x.min()) == 2.0  # training waited for validation's write
    finally:
        thread.close()

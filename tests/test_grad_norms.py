"""train.grad_clip: each optimizer step clipped at the configured norm, its norm before clipping kept for the epoch's
record (yolo_ray/worker/grad_norms.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import trainer_overrides
from torch import nn

from yolo_ray import ultralytics_env
from yolo_ray.worker.grad_norms import GradNorms


def _grads(scale: float) -> nn.Linear:
    layer = nn.Linear(4, 3)
    for p in layer.parameters():
        p.grad = torch.full_like(p, scale)
    return layer


def test_clips_at_the_configured_norm_and_keeps_the_norm_before() -> None:
    """Whatever limit the caller (Ultralytics: 10.0) passes, the step clips at max_norm; the summary counts the
    steps clipped and leaves out overflowed ones; outside the context torch's function is torch's again."""
    original = torch.nn.utils.clip_grad_norm_
    norms = GradNorms(max_norm=1.0)
    big, small = _grads(2.0), _grads(0.01)  # 15 entries each: norms 2 * sqrt(15) and 0.01 * sqrt(15)
    with norms.clipping():
        torch.nn.utils.clip_grad_norm_(big.parameters(), max_norm=10.0)
        torch.nn.utils.clip_grad_norm_(small.parameters(), max_norm=10.0)
        torch.nn.utils.clip_grad_norm_(_grads(math.inf).parameters(), max_norm=10.0)  # an AMP overflow step
    assert torch.nn.utils.clip_grad_norm_ is original
    after = torch.cat([p.grad.flatten() for p in big.parameters()]).norm()
    assert after == pytest.approx(1.0, rel=1e-5)  # clipped at 1.0, not at the caller's 10.0
    summary = norms.epoch_summary()
    assert summary["grad_norm_steps"] == 2 and summary["grad_clipped_share"] == 0.5
    assert summary["grad_norm_max"] == pytest.approx(2 * math.sqrt(15), rel=1e-5)
    assert summary["grad_norm_mean"] == pytest.approx((2 + 0.01) * math.sqrt(15) / 2, rel=1e-5)
    assert norms.epoch_summary() == {}  # read once: the next epoch starts empty


def test_zero_measures_and_never_clips() -> None:
    norms = GradNorms(max_norm=0)
    big = _grads(100.0)
    with norms.clipping():
        torch.nn.utils.clip_grad_norm_(big.parameters(), max_norm=10.0)
    assert all(bool((p.grad == 100.0).all()) for p in big.parameters())
    summary = norms.epoch_summary()
    assert summary["grad_clipped_share"] == 0.0 and summary["grad_norm_max"] == pytest.approx(100 * math.sqrt(15))


def _train_one_epoch(shapes_small: Path, tmp_path: Path, grad_clip: float) -> tuple[dict[str, Any], list, int]:
    ultralytics_env.setup()
    from yolo_ray.worker.trainer import trainer_class

    # one epoch, an optimizer step every batch from the first
    overrides = trainer_overrides(
        shapes_small, tmp_path, f"clip{grad_clip}", epochs=1, nbs=8, warmup_epochs=0, val=False
    )
    trainer = trainer_class("detect")(overrides, device=torch.device("cpu"), world_size=1, grad_clip=grad_clip)
    seen: dict[str, Any] = {}
    trainer.add_callback("on_train_epoch_end", lambda t: seen.update(first=t.grad_norms.norms[0].item()))
    trainer.add_callback("on_train_epoch_end", lambda t: seen.update(t.grad_norms.epoch_summary()))
    trainer.train()
    trainer.writer.close()
    return seen, [p.detach().clone() for p in trainer.model.parameters()], len(trainer.train_loader)


def test_the_trainer_clips_at_train_grad_clip(shapes_small: Path, tmp_path: Path) -> None:
    """Two runs from the same seed: one never clipped, one clipped at every step. Both measure the same first
    gradient (same weights, same batch), record one norm per optimizer step, and end with different weights."""
    free, free_weights, batches = _train_one_epoch(shapes_small, tmp_path, grad_clip=0)
    tight, tight_weights, _ = _train_one_epoch(shapes_small, tmp_path, grad_clip=1e-3)
    assert free["grad_norm_steps"] == tight["grad_norm_steps"] == batches
    assert free["grad_clipped_share"] == 0.0 and tight["grad_clipped_share"] == 1.0
    assert free["first"] == pytest.approx(tight["first"], rel=1e-4) and free["first"] > 1e-3
    assert any(not torch.equal(a, b) for a, b in zip(free_weights, tight_weights, strict=True))

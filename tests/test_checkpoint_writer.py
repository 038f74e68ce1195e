"""The background checkpoint save writes what Ultralytics' own save_model writes, keeps each epoch's file, and hands a
non-finite EMA to Ultralytics' synchronous save (which repairs it). A real 2-epoch training in one process, on the CPU
and, where there is one, on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import trainer_overrides

from yolo_ray import ultralytics_env
from yolo_ray.worker.checkpoint_writer import weights_digest


def _assert_same(ours: Any, theirs: Any, where: str = "ckpt") -> None:
    """Equal values, tensors bit for bit and of the same dtype (compared on the CPU: the writer's module copy lives
    there, and loading maps upstream's there too); modules by class, state and public attributes."""
    if isinstance(ours, torch.nn.Module):
        assert type(ours) is type(theirs), where
        _assert_same(ours.state_dict(), theirs.state_dict(), f"{where}.state_dict()")
        public = ({k: v for k, v in vars(m).items() if not k.startswith("_")} for m in (ours, theirs))
        _assert_same(*public, f"{where} attributes")
    elif isinstance(ours, torch.Tensor):
        assert ours.dtype == theirs.dtype and torch.equal(ours.cpu(), theirs.cpu()), where
    elif isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), where
        for k in ours:
            _assert_same(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(ours, list | tuple):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_background_save_is_ultralytics_checkpoint(device: str, shapes_small: Path, tmp_path: Path) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU here (run it with the device tool)")
    ultralytics_env.setup()
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolo_ray.worker.trainer import trainer_class

    overrides = trainer_overrides(shapes_small, tmp_path, "run", device="cpu" if device == "cpu" else "0")
    trainer = trainer_class("detect")(
        overrides, device=torch.device(device, 0) if device == "cuda" else torch.device(device), world_size=1
    )
    staged: dict[int, Path] = {}

    def compare_with_ultralytics_save(tr: Any) -> None:  # on_fit_epoch_end: after this epoch's save_model
        if tr.in_final_eval:
            return
        saved = tr.writer.saved(tr.epoch)
        staged[tr.epoch] = saved.directory / "last.pt"
        theirs_path = tmp_path / f"ultralytics_epoch{tr.epoch}.pt"
        live = tr.last, tr.best
        tr.last, tr.best = theirs_path, tmp_path / "ultralytics_best.pt"
        try:
            DetectionTrainer.save_model(tr)  # upstream's synchronous save of the same state
        finally:
            tr.last, tr.best = live
        ours, theirs = (torch.load(p, map_location="cpu", weights_only=False) for p in (staged[tr.epoch], theirs_path))
        ours.pop("date"), theirs.pop("date")
        _assert_same(ours, theirs)
        assert ours["ema"].model[0].conv.weight.dtype == torch.float16 and ours["ema"].criterion is None
        assert saved.weights_sha256 == weights_digest(theirs["ema"], as_saved=True)
        assert tr.last.read_bytes() == staged[tr.epoch].read_bytes()

    trainer.add_callback("on_fit_epoch_end", compare_with_ultralytics_save)
    trainer.train()
    assert sorted(staged) == [0, 1]
    # epoch 0's staged file kept its own bytes when epoch 1 replaced last.pt
    assert torch.load(staged[0], weights_only=False)["epoch"] == 0
    for epoch in staged:
        trainer.writer.release(epoch)
    assert not any(p.parent.exists() for p in staged.values())

    # A non-finite EMA: the background save declines, and Ultralytics' own save repairs the live EMA from the model
    weight = trainer.ema.ema.model[0].conv.weight
    weight.data[0, 0, 0, 0] = float("nan")
    trainer.epoch = 7
    assert trainer.save_model()
    assert torch.isfinite(weight).all()
    assert trainer.writer.saved(7).directory.joinpath("last.pt").is_file()
    assert torch.load(trainer.last, weights_only=False)["epoch"] == 7

    trainer.writer.close()

"""The val split's batches kept on the GPU after their first pass (worker/val_batches.py): every later pass gives the
loader's own batches, so the validator's metrics are the loader's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from yolo_ray.worker.val_batches import DeviceValBatches, on_device


def _val_loader(root: Path, batch: int = 8):
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    args = get_cfg(overrides={"imgsz": 160, "rect": True, "cache": False})
    data = check_det_dataset(str(root / "data.yaml"))
    dataset = build_yolo_dataset(args, data["val"], batch, data, mode="val", stride=32)
    return build_dataloader(dataset, batch, workers=0, shuffle=False, rank=-1)


def _same(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if torch.is_tensor(a) and torch.is_tensor(b):
        return torch.equal(a.cpu(), b.cpu())
    return bool(np.array_equal(a, b)) if isinstance(a, np.ndarray) else a == b


def test_later_passes_give_the_first_pass_batches_and_keep_them_unchanged(shapes_small: Path) -> None:
    loader = _val_loader(shapes_small)
    plain = list(loader)
    kept = DeviceValBatches(loader, torch.device("cpu"))
    kept.fits = True  # keep on the CPU: the mechanics are the device's
    assert len(kept) == len(loader) and kept.dataset is loader.dataset and kept.batch_size == loader.batch_size
    for _ in range(3):
        seen = []
        for batch in kept:
            seen.append(dict(batch))
            batch["img"] = batch["img"].float() / 255  # as the validator's preprocess does
        assert len(seen) == len(plain) and all(_same(a, b) for a, b in zip(seen, plain, strict=True))
    assert kept.kept is not None and all(b["img"].dtype == torch.uint8 for b in kept.kept)


class _Batches(list):
    dataset = "the dataset"


def test_a_pass_broken_off_keeps_nothing() -> None:
    kept = DeviceValBatches(_Batches({"img": torch.full((1,), i)} for i in range(3)), torch.device("cpu"))
    kept.fits = True
    broken = iter(kept)
    next(broken)
    del broken
    assert kept.kept is None
    assert [int(b["img"]) for b in kept] == [0, 1, 2] and kept.kept is not None
    assert [int(b["img"]) for b in kept] == [0, 1, 2] and kept.dataset == "the dataset"


def test_cpu_loaders_and_oversized_splits_are_served_by_the_loader(shapes_small: Path) -> None:
    loader = _val_loader(shapes_small)
    assert on_device(loader, torch.device("cpu")) is loader
    big = DeviceValBatches(loader, torch.device("cpu"))
    big.fits = False
    assert sum(1 for _ in big) == len(loader) and big.kept is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU only (the device tool)")
def test_validator_on_kept_batches_gives_the_loader_metrics(shapes_small: Path, tmp_path: Path) -> None:
    from ultralytics import YOLO

    model = YOLO("yolo11n.yaml")
    data = str(shapes_small / "data.yaml")
    model.train(data=data, epochs=3, imgsz=160, batch=16, device=0, workers=0, val=False, plots=False,
                project=str(tmp_path), name="t", verbose=False)  # fmt: skip
    from ultralytics.models.yolo.detect import DetectionValidator

    results = []
    loader = _val_loader(shapes_small, batch=16)
    for served in (loader, on_device(loader, torch.device("cuda", 0)), None):
        served = served if served is not None else results[-1][1]  # the kept batches' second pass
        v = DetectionValidator(dataloader=served, args={"data": data, "imgsz": 160, "batch": 16, "plots": False})
        stats = v(model=model.trainer.best)
        results.append((stats, served))
    assert isinstance(results[2][1], DeviceValBatches) and results[2][1].kept is not None
    assert results[2][1].kept[0]["img"].is_cuda
    plain = results[0][0]
    for stats, _ in results[1:]:  # the same tensors in; the GPU's kernels may differ in a last bit
        assert stats.keys() == plain.keys() and all(stats[k] == pytest.approx(plain[k], abs=1e-6) for k in plain)

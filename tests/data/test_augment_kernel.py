"""The fused Triton augmentation kernel against the torch reference (itself checked against Ultralytics in
test_device_loader), run on the CPU through Triton's interpreter on a real generated dataset."""

from __future__ import annotations

import pytest
import torch
from conftest import ultralytics_train_dataset

from yolo_ray.data.device_augment import AugmentHyp, augment_batch
from yolo_ray.data.device_cache import DeviceCache
from yolo_ray.data.synth import SynthSpec, generate

IMGSZ = 96


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> DeviceCache:
    root = tmp_path_factory.mktemp("shapes_kernel")
    generate(root, SynthSpec(images=24, imgsz=IMGSZ, classes=3, seed=5))
    _, dataset = ultralytics_train_dataset(root, IMGSZ)
    return DeviceCache.build(dataset, IMGSZ, torch.device("cpu"), threads=2)


@pytest.mark.parametrize(
    "hyp",
    [
        AugmentHyp(),
        AugmentHyp(mosaic=0.5, degrees=20.0, shear=5.0, scale=0.3, translate=0.2, flipud=0.5),
        AugmentHyp(mosaic=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0),
    ],
    ids=["defaults", "rotate-shear-half-mosaic-flips", "no-mosaic-no-hsv"],
)
def test_fused_kernel_matches_reference(cache: DeviceCache, hyp: AugmentHyp) -> None:
    batches = []
    for fused in (False, True):
        g = torch.Generator().manual_seed(11)
        batches.append(augment_batch(cache, torch.arange(12) % len(cache), hyp, g, fused=fused))
    (ref_img, ref_t), (img, t) = batches
    assert img.shape == ref_img.shape and img.dtype == torch.uint8
    assert img.is_contiguous(memory_format=torch.channels_last)
    for k in ref_t:  # same random draws, so the same boxes
        assert torch.equal(t[k], ref_t[k]), k
    diff = (img.int() - ref_img.int()).abs()
    assert diff.max() <= 1, "only rounding may differ"
    assert (diff > 0).float().mean() < 1e-3
    not_grey = (img.int() - 114).abs().amax(1) > 2
    assert not_grey.float().mean() > 0.2, "the batch shows images, not border"

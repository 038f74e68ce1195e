"""The device loader against Ultralytics' own CPU augmentation, on the CPU, with real Ultralytics datasets."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ultralytics_train_dataset

from yolo_ray.data.device_loader import AugmentHyp, DeviceCache, DeviceLoader, augment_batch, shard_ids
from yolo_ray.data.synth import SynthSpec, generate

IMGSZ = 128


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shapes_aug")
    generate(out, SynthSpec(images=120, imgsz=IMGSZ, classes=3, seed=3))
    return out


def _ours(root: Path, n: int, seed: int = 0, **hyp: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """n augmented samples from the device loader: images [n, 3, S, S] and per-image [k, 5] (cls, xywh) labels."""
    args, ds = ultralytics_train_dataset(root, IMGSZ, **hyp)
    cache = DeviceCache.build(ds, IMGSZ, torch.device("cpu"), threads=2)
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(n) % len(cache)
    img, t = augment_batch(cache, idx, AugmentHyp.from_args(args), g)
    labels = [torch.cat([t["cls"][t["batch_idx"] == i], t["bboxes"][t["batch_idx"] == i]], 1) for i in range(n)]
    return img, labels


def _theirs(root: Path, n: int, seed: int = 0, **hyp: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    _, ds = ultralytics_train_dataset(root, IMGSZ, **hyp)
    random.seed(seed)
    np.random.seed(seed)
    items = [ds[i % len(ds)] for i in range(n)]
    img = torch.stack([it["img"] for it in items])
    labels = [torch.cat([it["cls"].reshape(-1, 1), it["bboxes"]], 1) for it in items]
    return img, labels


def _stats(img: torch.Tensor, labels: list[torch.Tensor]) -> dict[str, float]:
    boxes = torch.cat(labels)
    w, h = boxes[:, 3], boxes[:, 4]
    return {
        "boxes_per_image": len(boxes) / len(labels),
        "w_median": float(w.median()),
        "h_median": float(h.median()),
        "area_p10": float((w * h).quantile(0.1)),
        "area_p90": float((w * h).quantile(0.9)),
        "x_mean": float(boxes[:, 1].mean()),
        "y_mean": float(boxes[:, 2].mean()),
        "grey_fraction": float((img.float() - 114).abs().amax(1).le(2).float().mean()),
        "pixel_mean": float(img.float().mean()),
        "pixel_std": float(img.float().std()),
    }


@pytest.mark.parametrize(
    "hyp",
    [{}, {"mosaic": 0.5, "degrees": 15.0, "shear": 5.0, "scale": 0.3, "translate": 0.2, "flipud": 0.5}],
    ids=["defaults", "rotate-shear-half-mosaic"],
)
def test_same_augmentation_statistics_as_ultralytics(shapes_dir: Path, hyp: dict) -> None:
    """Box counts, sizes, positions, border fraction and pixel statistics of 600 samples agree with Ultralytics'
    CPU pipeline: at its defaults (mosaic, scale 0.5, translate 0.1, HSV, flips) and with rotation and shear."""
    ours = _stats(*_ours(shapes_dir, 600, **hyp))
    theirs = _stats(*_theirs(shapes_dir, 600, **hyp))
    print("\n" + "\n".join(f"{k:16s} ours {ours[k]:.4f}  ultralytics {theirs[k]:.4f}" for k in ours))
    assert ours["boxes_per_image"] == pytest.approx(theirs["boxes_per_image"], rel=0.1)
    for key in ("w_median", "h_median", "area_p90"):
        assert ours[key] == pytest.approx(theirs[key], rel=0.1), key
    assert ours["area_p10"] == pytest.approx(theirs["area_p10"], rel=0.25)
    for key in ("x_mean", "y_mean"):
        assert ours[key] == pytest.approx(theirs[key], abs=0.03), key
    assert ours["grey_fraction"] == pytest.approx(theirs["grey_fraction"], abs=0.04)
    assert ours["pixel_mean"] == pytest.approx(theirs["pixel_mean"], abs=4)
    assert ours["pixel_std"] == pytest.approx(theirs["pixel_std"], rel=0.08)


@pytest.mark.parametrize("fliplr", [0.0, 1.0])
def test_deterministic_path_matches_ultralytics_pixel_for_pixel(shapes_dir: Path, fliplr: float) -> None:
    """With every random range closed (no mosaic, scale, translate, HSV) the geometry must be Ultralytics' own:
    same letterboxed image (bilinear vs cv2 linear: within 1 grey level on average) and the same boxes."""
    hyp = {"mosaic": 0.0, "scale": 0.0, "translate": 0.0, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "fliplr": fliplr}
    img_o, lab_o = _ours(shapes_dir, 8, **hyp)
    img_t, lab_t = _theirs(shapes_dir, 8, **hyp)
    assert img_o.shape == img_t.shape
    assert (img_o.float() - img_t.float()).abs().mean() < 1.0
    for o, t in zip(lab_o, lab_t, strict=True):
        assert len(o) == len(t) > 0
        o, t = o[o[:, 1].argsort()], t[t[:, 1].argsort()]
        torch.testing.assert_close(o, t, atol=1.5 / IMGSZ, rtol=0)


def test_loader_shards_and_replays(shapes_dir: Path) -> None:
    """Two ranks see disjoint halves of the data each epoch; the same (seed, epoch, rank) replays the same batches,
    so a resumed epoch is the epoch it would have been."""
    args, ds = ultralytics_train_dataset(shapes_dir, IMGSZ)
    cache = DeviceCache.build(ds, IMGSZ, torch.device("cpu"), threads=2)
    hyp = AugmentHyp.from_args(args)
    loaders = [DeviceLoader(ds, cache, 8, rank, 2, AugmentHyp(**vars(hyp)), seed=0) for rank in (0, 1)]
    for ld in loaders:
        ld.sampler.set_epoch(3)
    shards = [set(ld.sampler) for ld in loaders]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == len(ds)
    first = [b["img"] for b in loaders[0]]
    again = [b["img"] for b in loaders[0]]
    assert len(first) == len(loaders[0]) == -(-len(ds) // 2 // 8)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    loaders[0].sampler.set_epoch(4)
    assert not torch.equal(next(iter(loaders[0]))["img"], first[0])


def test_a_cache_that_cannot_fit_fails_before_allocating() -> None:
    """The decoded set must fit (60% of free memory): otherwise a clear error naming the key and the fix, raised
    before the tensor is allocated."""
    import psutil

    from yolo_ray.data.device_loader import _check_fits

    too_many = int(psutil.virtual_memory().available / (640 * 640 * 3)) + 1
    with pytest.raises(RuntimeError) as err:
        _check_fits(too_many, 640, torch.device("cpu"))
    assert "data.loader: ultralytics" in str(err.value) and "train.imgsz" in str(err.value)
    assert "data.device_cache: sharded" in str(err.value)
    with pytest.raises(RuntimeError, match="more workers"):  # already sharded: the shard itself is too large
        _check_fits(too_many, 640, torch.device("cpu"), sharded=True)
    _check_fits(100, 640, torch.device("cpu"))  # 117 MiB fits


@pytest.mark.parametrize(("n", "world"), [(120, 2), (121, 2), (121, 3)])
def test_shards_are_disjoint_equal_and_cover_the_data(n: int, world: int) -> None:
    """data.device_cache=sharded: every image on some rank, no image on two (but the wrap-around padding), and
    every rank as many images, so that every rank steps as often."""
    shards = [shard_ids(n, rank, world, seed=0) for rank in range(world)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == -(-n // world)
    assert set().union(*shards) == set(range(n))
    assert sum(len(s) for s in shards) - n == (-n) % world  # the padding, nothing more
    assert shard_ids(n, 0, world, seed=0) == shards[0] and shard_ids(n, 0, world, seed=1) != shards[0]


def test_sharded_cache_holds_its_share_and_samples_only_it(shapes_dir: Path) -> None:
    """A rank's sharded cache is exactly the replicated cache's rows for its images; its loader serves only those
    images, each once an epoch, reshuffled between epochs and replayed for the same epoch."""
    args, ds = ultralytics_train_dataset(shapes_dir, IMGSZ)
    full = DeviceCache.build(ds, IMGSZ, torch.device("cpu"), threads=2)
    hyp = AugmentHyp.from_args(args)
    seen: list[set[int]] = []
    for rank in (0, 1):
        ids = shard_ids(len(ds), rank, 2, seed=0)
        part = DeviceCache.build(ds, IMGSZ, torch.device("cpu"), threads=2, ids=ids)
        assert len(part) == len(ds) // 2
        assert torch.equal(part.images, full.images[ids]) and torch.equal(
            part.boxes, full.boxes[ids][:, : part.boxes.shape[1]]
        )
        loader = DeviceLoader(ds, part, 8, rank, 2, AugmentHyp(**vars(hyp)), seed=0)
        loader.sampler.set_epoch(2)
        files = [f for b in loader for f in b["im_file"]]
        assert sorted(files) == sorted(ds.im_files[i] for i in ids)  # its images, each once
        assert [f for b in loader for f in b["im_file"]] == files  # the same epoch replays
        loader.sampler.set_epoch(3)
        assert [f for b in loader for f in b["im_file"]] != files
        seen.append(set(loader.sampler))
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == len(ds)

"""The device loader against Ultralytics' own CPU augmentation, on the CPU, with real Ultralytics datasets."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ultralytics_train_dataset

from yolo_ray.data.device_augment import AugmentHyp, augment_batch
from yolo_ray.data.device_cache import DeviceCache, shard_ids
from yolo_ray.data.device_loader import DeviceLoader
from yolo_ray.data.synth import SynthSpec, generate

IMGSZ = 128
SCENES_IMGSZ = 192  # real-shaped scenes: 96x72 to 384x216 files, so that loading resizes both up and down


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shapes_aug")
    generate(out, SynthSpec(images=120, imgsz=IMGSZ, classes=3, seed=3))
    return out


@pytest.fixture(scope="module")
def scenes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real-shaped scenes (style=real): nine sizes and aspect ratios, crowds of small objects, occlusion, clutter,
    empty, grey and PNG images."""
    out = tmp_path_factory.mktemp("scenes_aug")
    generate(out, SynthSpec(images=150, imgsz=SCENES_IMGSZ, classes=5, seed=4, style="real"))
    return out


def _ours(
    root: Path, n: int, seed: int = 0, imgsz: int = IMGSZ, **hyp: float
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """n augmented samples from the device loader: images [n, 3, S, S] and per-image [k, 5] (cls, xywh) labels."""
    args, ds = ultralytics_train_dataset(root, imgsz, **hyp)
    cache = DeviceCache.build(ds, imgsz, torch.device("cpu"), threads=2)
    g = torch.Generator().manual_seed(seed)
    images, labels = [], []
    for start in range(0, n, 100):  # batches of 100, as a loader would: the reference path's memory stays small
        idx = torch.arange(start, min(n, start + 100)) % len(cache)
        img, t = augment_batch(cache, idx, AugmentHyp.from_args(args), g)
        images.append(img)
        labels += [
            torch.cat([t["cls"][t["batch_idx"] == i], t["bboxes"][t["batch_idx"] == i]], 1) for i in range(len(idx))
        ]
    return torch.cat(images), labels


def _theirs(
    root: Path, n: int, seed: int = 0, imgsz: int = IMGSZ, **hyp: float
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    _, ds = ultralytics_train_dataset(root, imgsz, **hyp)
    random.seed(seed)
    np.random.seed(seed)
    items = [ds[i % len(ds)] for i in range(n)]
    img = torch.stack([it["img"] for it in items])
    labels = [torch.cat([it["cls"].reshape(-1, 1), it["bboxes"]], 1) for it in items]
    return img, labels


def _stats(img: torch.Tensor, labels: list[torch.Tensor]) -> dict[str, float]:
    boxes = torch.cat(labels)
    w, h = boxes[:, 3], boxes[:, 4]
    side = (w * h).sqrt() * img.shape[-1]  # pixels
    return {
        "empty_fraction": sum(len(lb) == 0 for lb in labels) / len(labels),
        "side_px_p05": float(side.quantile(0.05)),
        "side_px_p25": float(side.quantile(0.25)),
        "side_px_median": float(side.median()),
        "side_px_p90": float(side.quantile(0.9)),
        "small_fraction": float((side < 8).float().mean()),  # what COCO's AP_small is made of, at this scale
        **_mean_and_se("box_cover", _box_cover(labels, img.shape[-1])),
        **_mean_and_se("boxes_per_image", [float(len(lb)) for lb in labels]),
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


def _mean_and_se(key: str, values: list[float]) -> dict[str, float]:
    """A per-image quantity's mean and its standard error (mosaic and single-image samples differ several-fold in
    box count, so its mean moves by several percent between two draws of 600 samples)."""
    v = torch.tensor(values, dtype=torch.float64)
    return {key: float(v.mean()), f"{key}_se": float(v.std() / len(v) ** 0.5)}


def _box_cover(labels: list[torch.Tensor], size: int) -> list[float]:
    """Per image, the fraction that its boxes cover: object pixels against background and border."""
    covered = []
    for lb in labels:
        m = torch.zeros(size, size, dtype=torch.bool)
        for _, x, y, w, h in lb.tolist():
            x1, y1 = max(0, int((x - w / 2) * size)), max(0, int((y - h / 2) * size))
            m[y1 : int((y + h / 2) * size) + 1, x1 : int((x + w / 2) * size) + 1] = True
        covered.append(float(m.float().mean()))
    return covered


def _assert_same_distribution(ours: dict[str, float], theirs: dict[str, float]) -> None:
    print("\n" + "\n".join(f"{k:16s} ours {ours[k]:.4f}  ultralytics {theirs[k]:.4f}" for k in ours))
    for key in ("boxes_per_image", "box_cover"):  # means: within 3.5 standard errors of their difference
        se = (ours[f"{key}_se"] ** 2 + theirs[f"{key}_se"] ** 2) ** 0.5
        assert abs(ours[key] - theirs[key]) < 3.5 * se, (key, ours[key], theirs[key], se)
    assert ours["empty_fraction"] == pytest.approx(theirs["empty_fraction"], abs=0.04)
    for key in ("w_median", "h_median", "area_p90", "side_px_p25", "side_px_median", "side_px_p90"):
        assert ours[key] == pytest.approx(theirs[key], rel=0.1), key
    for key in ("area_p10", "side_px_p05"):
        assert ours[key] == pytest.approx(theirs[key], rel=0.25), key
    assert ours["small_fraction"] == pytest.approx(theirs["small_fraction"], abs=0.04)
    for key in ("x_mean", "y_mean"):
        assert ours[key] == pytest.approx(theirs[key], abs=0.03), key
    assert ours["grey_fraction"] == pytest.approx(theirs["grey_fraction"], abs=0.04)
    assert ours["pixel_mean"] == pytest.approx(theirs["pixel_mean"], abs=4)
    assert ours["pixel_std"] == pytest.approx(theirs["pixel_std"], rel=0.08)


@pytest.mark.parametrize(
    "hyp",
    [{}, {"mosaic": 0.5, "degrees": 15.0, "shear": 5.0, "scale": 0.3, "translate": 0.2, "flipud": 0.5}],
    ids=["defaults", "rotate-shear-half-mosaic"],
)
def test_same_augmentation_statistics_as_ultralytics(shapes_dir: Path, hyp: dict) -> None:
    """Box counts, sizes, positions, border fraction and pixel statistics of 600 samples agree with Ultralytics'
    CPU pipeline: at its defaults (mosaic, scale 0.5, translate 0.1, HSV, flips) and with rotation and shear."""
    _assert_same_distribution(_stats(*_ours(shapes_dir, 600, **hyp)), _stats(*_theirs(shapes_dir, 600, **hyp)))


@pytest.mark.parametrize(
    "hyp",
    [{}, {"mosaic": 0.0}, {"mosaic": 0.5, "degrees": 10.0, "shear": 3.0, "scale": 0.9}],
    ids=["mosaic", "close-mosaic-epochs", "half-mosaic-rotate-scale0.9"],
)
def test_same_augmentation_statistics_on_real_shaped_scenes(scenes_dir: Path, hyp: dict) -> None:
    """The same on images of nine sizes and aspect ratios with crowds of small, occluded objects, empty and grey
    images: mosaic canvases of non-square tiles; the single-image path of the close_mosaic epochs (Ultralytics
    warps the image itself about its centre, no letterbox); clipping and box_candidates on small boxes. Sizes are
    judged in pixels, where the small-object end (under 8 px at this scale) is what COCO's AP_small measures."""
    kw = {"imgsz": SCENES_IMGSZ, **hyp}
    _assert_same_distribution(_stats(*_ours(scenes_dir, 600, **kw)), _stats(*_theirs(scenes_dir, 600, **kw)))


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


@pytest.mark.parametrize("fliplr", [0.0, 1.0])
def test_deterministic_path_on_real_shaped_scenes(scenes_dir: Path, fliplr: float) -> None:
    """The single-image geometry on non-square images (landscape, portrait, HD), grey and PNG files and empty
    images: every pixel and box where Ultralytics puts it, an empty image staying empty."""
    hyp = {"mosaic": 0.0, "scale": 0.0, "translate": 0.0, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "fliplr": fliplr}
    img_o, lab_o = _ours(scenes_dir, 40, imgsz=SCENES_IMGSZ, **hyp)
    img_t, lab_t = _theirs(scenes_dir, 40, imgsz=SCENES_IMGSZ, **hyp)
    assert (img_o.float() - img_t.float()).abs().mean() < 1.0
    assert any(len(t) == 0 for t in lab_t) and any(len(t) > 5 for t in lab_t)  # the set has both
    for o, t in zip(lab_o, lab_t, strict=True):
        assert len(o) == len(t)
        o, t = o[o[:, 1].argsort()], t[t[:, 1].argsort()]
        torch.testing.assert_close(o, t, atol=1.5 / SCENES_IMGSZ, rtol=0)


def test_hsv_matches_ultralytics_for_the_same_gains(scenes_dir: Path) -> None:
    """RandomHSV's colour change for the same random gains: Ultralytics goes through OpenCV's uint8 HSV and lookup
    tables, the device loader computes in float; they may differ by that quantisation only (under 1.5 grey levels on
    average, no bias over a level), on colour, grey and mostly-border images alike."""
    import cv2
    from ultralytics.data.augment import RandomHSV

    from yolo_ray.data.device_augment import _hsv

    hsv, scale = RandomHSV(hgain=0.015, sgain=0.7, vgain=0.4), np.array([0.015, 0.7, 0.4])
    files = sorted((scenes_dir / "train" / "images").iterdir())[:30]
    diffs, bias = [], []
    for i, f in enumerate(files):
        bgr = cv2.imread(str(f), cv2.IMREAD_COLOR)
        np.random.seed(i)  # RandomHSV draws its gains from numpy: the same draw here tells which it used
        gains = np.random.uniform(-1, 1, 3) * scale
        np.random.seed(i)
        theirs = hsv({"img": bgr.copy()})["img"][..., ::-1].astype(np.float32)
        rgb = torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1])).permute(2, 0, 1)[None].float()
        ours = _hsv(rgb, torch.tensor(gains, dtype=torch.float32)[None]).round().clamp(0, 255)[0]
        ours = ours.permute(1, 2, 0).numpy()
        diffs.append(np.abs(ours - theirs).mean())
        bias.append((ours - theirs).mean())
    assert np.mean(diffs) < 1.5 and abs(np.mean(bias)) < 1.0, (np.mean(diffs), np.mean(bias))


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

    from yolo_ray.data.device_cache import _check_fits

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


# --------------------------------------------------------------------------------------------------- pose keypoints


@pytest.fixture(scope="module")
def pose_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Quadrilaterals turned by up to 30 degrees, their corners as keypoints (top-left, top-right, bottom-right,
    bottom-left before the turn; flip_idx [1, 0, 3, 2])."""
    out = tmp_path_factory.mktemp("pose_aug")
    generate(out, SynthSpec(images=120, imgsz=IMGSZ, classes=3, seed=5, task="pose"))
    return out


Objects = list[tuple[torch.Tensor, torch.Tensor]]  # per sample: boxes [k, 4] xywh, keypoints [k, nk, 3]


def _pose_ours(root: Path, n: int, **hyp: float) -> Objects:
    args, ds = ultralytics_train_dataset(root, IMGSZ, task="pose", **hyp)
    cache = DeviceCache.build(ds, IMGSZ, torch.device("cpu"), threads=2)
    assert cache.flip_idx == [1, 0, 3, 2]
    g = torch.Generator().manual_seed(0)
    out: Objects = []
    for start in range(0, n, 100):
        idx = torch.arange(start, min(n, start + 100)) % len(cache)
        _, t = augment_batch(cache, idx, AugmentHyp.from_args(args), g)
        out += [(t["bboxes"][t["batch_idx"] == i], t["keypoints"][t["batch_idx"] == i]) for i in range(len(idx))]
    return out


def _pose_theirs(root: Path, n: int, **hyp: float) -> Objects:
    _, ds = ultralytics_train_dataset(root, IMGSZ, task="pose", **hyp)
    random.seed(0)
    np.random.seed(0)
    return [(it["bboxes"], it["keypoints"]) for it in (ds[i % len(ds)] for i in range(n))]


@pytest.mark.parametrize("fliplr", [0.0, 1.0])
def test_keypoints_where_ultralytics_puts_them(pose_dir: Path, fliplr: float) -> None:
    """Every random range closed: each keypoint lands where Ultralytics' pipeline puts it, with its visibility, and
    a flipped image's keypoints are reordered by flip_idx (the top-left corner is still keypoint 0)."""
    hyp = {"mosaic": 0.0, "scale": 0.0, "translate": 0.0, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "fliplr": fliplr}
    for (bo, ko), (bt, kt) in zip(_pose_ours(pose_dir, 16, **hyp), _pose_theirs(pose_dir, 16, **hyp), strict=True):
        assert len(bo) == len(bt) > 0
        o, t = bo[:, 0].argsort(), bt[:, 0].argsort()
        torch.testing.assert_close(ko[o], kt[t], atol=1.5 / IMGSZ, rtol=0)


def _pose_stats(samples: Objects) -> dict[str, float]:
    """Keypoint visibility, and each keypoint's mean place in its box (-0.5 .. 0.5 of the box's width and height)
    over the visible ones: a flip without flip_idx would pull every corner's mean towards the centre."""
    boxes = torch.cat([b for b, _ in samples])
    kpts = torch.cat([k for _, k in samples])
    visible = kpts[..., 2] > 0
    rel = (kpts[..., :2] - boxes[:, None, :2]) / boxes[:, None, 2:]
    out = {"visible_fraction": float(visible.float().mean())}
    for i in range(kpts.shape[1]):
        seen = rel[visible[:, i], i]
        out[f"kpt{i}_x"], out[f"kpt{i}_y"] = float(seen[:, 0].mean()), float(seen[:, 1].mean())
    return out


@pytest.mark.parametrize(
    "hyp", [{}, {"mosaic": 0.5, "degrees": 15.0, "fliplr": 0.0, "flipud": 1.0}], ids=["defaults", "rotate-flipud"]
)
def test_keypoint_statistics_as_ultralytics(pose_dir: Path, hyp: dict) -> None:
    """600 augmented samples (mosaic, scale, translate, left-right flips; then rotation and every image flipped
    up-down, which Ultralytics reorders by flip_idx too: a mirror swaps left and right):
    as many keypoints stay visible (those cut off by the mosaic canvas or the image turn invisible) and each corner
    keeps its place in its box, as in Ultralytics' pipeline."""
    ours, theirs = _pose_stats(_pose_ours(pose_dir, 600, **hyp)), _pose_stats(_pose_theirs(pose_dir, 600, **hyp))
    print("\n" + "\n".join(f"{k:16s} ours {ours[k]:.4f}  ultralytics {theirs[k]:.4f}" for k in ours))
    assert ours["visible_fraction"] == pytest.approx(theirs["visible_fraction"], abs=0.03)
    assert theirs["visible_fraction"] < 0.99  # some keypoints were cut off: visibility was exercised
    for k in ours:
        assert ours[k] == pytest.approx(theirs[k], abs=0.04), k

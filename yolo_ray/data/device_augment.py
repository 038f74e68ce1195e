"""The device loader's augmentation of a whole batch on the device, as Ultralytics augments each image on the CPU:

    mosaic (p = hyp.mosaic) -> random affine (degrees, translate, scale, shear) -> HSV -> flips

Random parameters and labels as batched tensor ops; the pixels in one fused Triton kernel on CUDA (augment_kernel.py)
or as torch ops (the reference, on CPU). The distributions are Ultralytics' (Mosaic centre,
RandomPerspective._compute_affine_matrix, RandomHSV, RandomFlip); boxes go through its filters (clip, zero-area
removal, box_candidates), keypoints through the same affine and the dataset's flip_idx.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from yolo_ray.data.device_cache import PAD, DeviceCache


@dataclass
class AugmentHyp:
    """The augmentation hyperparameters of an Ultralytics train config that this loader reproduces."""

    mosaic: float = 1.0
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    fliplr: float = 0.5
    flipud: float = 0.0

    @classmethod
    def from_args(cls, args: Any) -> AugmentHyp:
        return cls(**{k: float(getattr(args, k)) for k in cls.__dataclass_fields__})


def augment_batch(
    cache: DeviceCache, idx: torch.Tensor, hyp: AugmentHyp, g: torch.Generator, fused: bool | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One augmented batch: uint8 images [B, 3, S, S] (channels_last memory) and Ultralytics' target tensors.

    fused: the pixel work as one Triton kernel (augment_kernel; the default on CUDA) or as torch ops (the reference,
    the default on CPU). Both draw the same random numbers, so a seed gives the same batch either way."""
    s, dev, b = cache.size, cache.images.device, idx.numel()

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, device=dev)

    mosaic = rand(b) < hyp.mosaic
    tiles = torch.cat([idx[:, None], torch.randint(0, len(cache), (b, 3), generator=g, device=dev)], 1)
    layout = _mosaic_layout(cache, tiles, mosaic, rand)
    warp = _affine(b, layout.canvas, s, hyp, rand)
    # labels first: their nonzero() is the one host sync, and it then waits only for this cheap label math; the
    # pixel work below is queued behind it and runs while the host goes on to launch the training step
    targets = _targets(cache, layout, warp)
    gains = _hsv_gains(b, hyp, rand, dev)
    minv = torch.linalg.inv_ex(warp.pixels).inverse  # inv_ex: no host sync to check singularity
    if dev.type == "cuda" if fused is None else fused:
        from yolo_ray.data import augment_kernel

        sizes = layout.hw.flip(-1) * layout.active[..., None]
        params = augment_kernel.pack_params(minv, layout.canvas, layout.centre, layout.origin, sizes, gains)
        return augment_kernel.warp_hsv(cache.images, tiles, params, gains is not None, PAD), targets
    img = _warp(cache, layout, minv, hyp.mosaic > 0)
    if gains is not None:
        img = _hsv(img, gains)
    return img.round_().clamp_(0, 255).to(torch.uint8), targets


class Layout(NamedTuple):
    """Which cached images make up each sample and where they sit on its canvas."""

    tiles: torch.Tensor  # [B, 4] cache indices: the sample's own image, then 3 mosaic partners
    active: torch.Tensor  # [B, 4] bool: the partners only in mosaic samples
    hw: torch.Tensor  # [B, 4, 2] each tile's (h, w)
    origin: torch.Tensor  # [B, 4, 2] each tile's top-left corner on the canvas (x, y)
    canvas: torch.Tensor  # [B, 2] canvas (w, h)
    centre: torch.Tensor  # [B, 2] where the mosaic quadrants meet (x, y); far off the canvas for plain samples


def _mosaic_layout(cache: DeviceCache, tiles: torch.Tensor, mosaic: torch.Tensor, rand: Any) -> Layout:
    """The canvas is 2S x 2S around a random centre for mosaic samples, the image itself otherwise."""
    b, s = tiles.shape[0], cache.size
    hw = cache.hw[tiles]
    h, w = hw[..., 0], hw[..., 1]
    xc = torch.floor(s / 2 + rand(b) * s)  # Ultralytics: int(uniform(s/2, 3s/2))
    yc = torch.floor(s / 2 + rand(b) * s)
    ox = torch.stack([xc - w[:, 0], xc, xc - w[:, 2], xc], 1)
    oy = torch.stack([yc - h[:, 0], yc - h[:, 1], yc, yc], 1)
    origin = torch.stack([ox, oy], -1)
    origin = torch.where(mosaic[:, None, None], origin, torch.zeros_like(origin))
    single = torch.stack([w[:, 0], h[:, 0]], -1)
    canvas = torch.where(mosaic[:, None], torch.full_like(single, 2 * s), single)
    active = torch.cat([torch.ones_like(mosaic)[:, None], mosaic[:, None].expand(b, 3)], 1)
    centre = torch.where(mosaic[:, None], torch.stack([xc, yc], -1), torch.full_like(single, 1e9))
    return Layout(tiles, active, hw, origin, canvas, centre)


class Warp(NamedTuple):
    """Each sample's affine from its canvas to the output image, flips folded in."""

    pixels: torch.Tensor  # [B, 3, 3] for pixel indices
    coords: torch.Tensor  # [B, 3, 3] for label coordinates
    scale: torch.Tensor  # [B] the sampled scale
    mirrored: torch.Tensor  # [B] bool: flipped one way (left-right or up-down), not both (a half turn)


def _affine(b: int, canvas: torch.Tensor, s: int, hyp: AugmentHyp, rand: Any) -> Warp:
    """RandomPerspective's M = T @ S @ R @ C per sample (no perspective) with the flips folded in, once for pixel
    indices and once for label coordinates."""
    dev = canvas.device

    def uniform(lo: float | torch.Tensor, hi: float | torch.Tensor) -> torch.Tensor:
        return lo + (hi - lo) * rand(b)

    def eye() -> torch.Tensor:
        return torch.eye(3, device=dev).repeat(b, 1, 1)

    c = eye()
    c[:, 0, 2], c[:, 1, 2] = -canvas[:, 0] / 2, -canvas[:, 1] / 2
    a = uniform(-hyp.degrees, hyp.degrees) * math.pi / 180
    scale = uniform(1 - hyp.scale, 1 + hyp.scale)
    r = eye()  # cv2.getRotationMatrix2D(angle=a, center=(0, 0), scale=scale)
    r[:, 0, 0], r[:, 0, 1] = scale * torch.cos(a), scale * torch.sin(a)
    r[:, 1, 0], r[:, 1, 1] = -scale * torch.sin(a), scale * torch.cos(a)
    sh = eye()
    sh[:, 0, 1] = torch.tan(uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    sh[:, 1, 0] = torch.tan(uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    t = eye()
    t[:, 0, 2] = uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * s
    t[:, 1, 2] = uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * s
    a = t @ sh @ r @ c
    lr, ud = rand(b) < hyp.fliplr, rand(b) < hyp.flipud

    def flipped(width: float) -> torch.Tensor:  # x -> width - x where flipped (and y likewise)
        f = eye()
        f[:, 0, 0], f[:, 0, 2] = torch.where(lr, -1.0, 1.0), torch.where(lr, width, 0.0)
        f[:, 1, 1], f[:, 1, 2] = torch.where(ud, -1.0, 1.0), torch.where(ud, width, 0.0)
        return f @ a

    # np.fliplr moves pixel index x to S-1-x; a box edge at x moves to S-x
    return Warp(flipped(s - 1.0), flipped(float(s)), scale, lr ^ ud)


def _warp(cache: DeviceCache, layout: Layout, minv: torch.Tensor, mosaic_possible: bool) -> torch.Tensor:
    """Each output pixel maps back through M^-1 to the canvas, then into the one tile covering it (bilinear);
    pixels no tile covers are grey, as in cv2.warpAffine(borderValue=114) over Ultralytics' mosaic canvas."""
    tiles, active, origin, canvas, s = layout.tiles, layout.active, layout.origin, layout.canvas, cache.size
    b, dev = tiles.shape[0], tiles.device
    src = (cache.pixel_grid @ minv.transpose(1, 2))[..., :2]  # [B, S*S, 2] canvas coordinates
    on_canvas = ((src >= -0.5) & (src < canvas[:, None, :] - 0.5)).all(-1)
    out = torch.full((b, 3, s, s), PAD, device=dev)
    for q in range(4 if mosaic_possible else 1):  # decided on the host: no GPU sync
        local = src - origin[:, q, None, :]
        size = layout.hw[:, q, None, :].flip(-1)  # (w, h)
        inside = on_canvas & active[:, q, None] & ((local >= -0.5) & (local < size - 0.5)).all(-1)
        pixels = cache.images[tiles[:, q]].permute(0, 3, 1, 2).float()  # [B, 3, S, S]
        norm = (2 * local + 1) / s - 1  # grid_sample, align_corners=False: pixel index -> [-1, 1]
        sampled = F.grid_sample(
            pixels, norm.view(b, s, s, 2), mode="bilinear", padding_mode="border", align_corners=False
        )
        out = torch.where(inside.view(b, 1, s, s), sampled, out)
    return out.contiguous(memory_format=torch.channels_last)


def _hsv_gains(b: int, hyp: AugmentHyp, rand: Any, dev: torch.device) -> torch.Tensor | None:
    """RandomHSV's per-image gains U(-1, 1) x (hsv_h, hsv_s, hsv_v); None when HSV is off."""
    if not (hyp.hsv_h or hyp.hsv_s or hyp.hsv_v):
        return None
    scale = torch.tensor([hyp.hsv_h, hyp.hsv_s, hyp.hsv_v], device=dev)
    return (rand(b, 3) * 2 - 1) * scale


def _hsv(img: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """RandomHSV: hue shifted by gain_h of a turn, saturation and value scaled by 1 + gain."""
    rgb = img / 255
    r, g, bl = rgb.unbind(1)
    v, _ = rgb.max(1)
    delta = v - rgb.min(1).values
    sat = torch.where(v > 0, delta / v.clamp_min(1e-8), torch.zeros_like(v))
    d = delta.clamp_min(1e-8)
    hue = torch.where(v == r, ((g - bl) / d) % 6, torch.where(v == g, (bl - r) / d + 2, (r - g) / d + 4))
    hue = torch.where(delta > 0, hue / 6, torch.zeros_like(hue))
    hue = (hue + gains[:, 0, None, None]) % 1.0
    sat = (sat * (1 + gains[:, 1, None, None])).clamp(0, 1)
    v = (v * (1 + gains[:, 2, None, None])).clamp(0, 1)
    channels = []
    for n in (5, 3, 1):  # HSV -> RGB: f(n) = V - V*S*clamp(min(k, 4 - k), 0, 1), k = (n + 6H) mod 6
        k = (n + hue * 6) % 6
        channels.append(v - v * sat * torch.clamp(torch.minimum(k, 4 - k), 0, 1))
    return torch.stack(channels, 1).mul_(255).contiguous(memory_format=torch.channels_last)


def _targets(cache: DeviceCache, layout: Layout, warp: Warp) -> dict[str, torch.Tensor]:
    """Boxes (and keypoints) moved like the pixels and filtered as Ultralytics does; in its batch format."""
    tiles, active, origin, canvas, s = layout.tiles, layout.active, layout.origin, layout.canvas, cache.size
    b, m, scale = tiles.shape[0], warp.coords, warp.scale
    boxes = cache.boxes[tiles] + origin.repeat(1, 1, 2)[:, :, None, :]  # [B, 4, K, 4] canvas xyxy
    limit = canvas.repeat(1, 2)[:, None, None, :]
    boxes = torch.minimum(boxes.clamp_min(0), limit)  # Mosaic: clip to the canvas
    keep = cache.valid[tiles] & active[:, :, None]
    keep &= (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])  # remove_zero_area_boxes
    boxes, keep = boxes.reshape(b, -1, 4), keep.reshape(b, -1)
    cls = cache.cls[tiles].reshape(b, -1)
    corners = boxes[..., [0, 1, 2, 3, 0, 3, 2, 1]].reshape(b, -1, 2)  # RandomPerspective.apply_bboxes
    moved = corners @ m[:, :2, :2].transpose(1, 2) + m[:, None, :2, 2]
    moved = moved.reshape(b, -1, 4, 2)
    new = torch.cat([moved.amin(2), moved.amax(2)], -1).clamp(0, s)
    old = boxes * scale[:, None, None]
    w1, h1 = old[..., 2] - old[..., 0], old[..., 3] - old[..., 1]
    w2, h2 = new[..., 2] - new[..., 0], new[..., 3] - new[..., 1]
    ar = torch.maximum(w2 / (h2 + 1e-16), h2 / (w2 + 1e-16))
    keep &= (w2 > 2) & (h2 > 2) & (w2 * h2 / (w1 * h1 + 1e-16) > 0.1) & (ar < 100)  # box_candidates
    bi, j = keep.nonzero(as_tuple=True)
    sel = new[bi, j]
    xywh = torch.cat([(sel[:, :2] + sel[:, 2:]) / 2, sel[:, 2:] - sel[:, :2]], 1) / s
    targets = {"batch_idx": bi.float(), "cls": cls[bi, j][:, None], "bboxes": xywh}
    if cache.keypoints is not None:
        targets["keypoints"] = _keypoints(cache, layout, warp)[bi, j]
    return targets


def _keypoints(cache: DeviceCache, layout: Layout, warp: Warp) -> torch.Tensor:
    """[B, 4K, nk, 3] keypoints moved like the pixels, normalised: invisible where they fall off the mosaic canvas
    (Instances.clip) or off the output image (apply_keypoints), clipped to it, and reordered by flip_idx in a
    mirrored image (RandomFlip reorders at each flip, up-down too: a mirror swaps left and right; two undo it)."""
    s = cache.size
    kp = cache.keypoints[layout.tiles]  # [B, 4, K, nk, 3]
    xy = kp[..., :2] + layout.origin[:, :, None, None, :]
    limit = layout.canvas[:, None, None, None, :]
    vis = kp[..., 2] * ((xy >= 0) & (xy <= limit)).all(-1)
    xy = torch.minimum(xy.clamp_min(0), limit).flatten(1, 2)  # [B, 4K, nk, 2]
    m = warp.coords
    xy = torch.einsum("bknj,bij->bkni", xy, m[:, :2, :2]) + m[:, None, None, :2, 2]
    vis = vis.flatten(1, 2) * ((xy >= 0) & (xy <= s)).all(-1)
    out = torch.cat([xy.clamp(0, s) / s, vis[..., None]], -1)
    if cache.flip_idx is not None:
        out = torch.where(warp.mirrored[:, None, None, None], out[:, :, cache.flip_idx], out)
    return out

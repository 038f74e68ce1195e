"""The device loader's pixel work as one fused Triton kernel: mosaic tile lookup -> inverse affine -> bilinear sample
-> HSV -> uint8, one pass per output pixel.

The same work in plain torch ops (device_augment._warp and _hsv, the reference) walks the whole batch about forty times
in float32 (four grid_samples over every tile, masks, HSV temporaries): on an H200 that took 20 ms of a 53 ms
YOLO11n step at 64 images and 73 ms of 113 ms at 256. Here each output pixel reads its four neighbours from the
uint8 cache and writes three bytes. Numerics follow the reference (grid_sample bilinear, align_corners=False, border
padding inside the image's slot; the same HSV formulas), so the two agree to within one grey level.

On CPU tensors the kernel runs in Triton's interpreter, which is how the tests compare it with the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from yolo_ray import triton_kernels

N_PARAMS = 29  # per-sample floats, laid out by pack_params
BLOCK = 1024


def _warp_hsv(
    cache_ptr,  # [N, S, S, 3] uint8
    tiles_ptr,  # [B, 4] int64 cache rows
    params_ptr,  # [B, N_PARAMS] float32
    out_ptr,  # [B, S, S, 3] uint8
    S,
    pad,
    N_PARAMS: tl.constexpr,
    HSV: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    npix = S * S
    live = p < npix
    x = (p % S).to(tl.float32)
    y = (p // S).to(tl.float32)
    prm = params_ptr + b * N_PARAMS
    sx = tl.load(prm + 0) * x + tl.load(prm + 1) * y + tl.load(prm + 2)
    sy = tl.load(prm + 3) * x + tl.load(prm + 4) * y + tl.load(prm + 5)
    on_canvas = (sx >= -0.5) & (sx < tl.load(prm + 6) - 0.5) & (sy >= -0.5) & (sy < tl.load(prm + 7) - 0.5)

    # the quadrant around the mosaic centre picks the tile (tiles never overlap); a plain sample has one quadrant
    right = sx >= tl.load(prm + 8) - 0.5
    below = sy >= tl.load(prm + 9) - 0.5
    q = right.to(tl.int32) + 2 * below.to(tl.int32)
    ox = tl.load(prm + 10 + q, mask=live, other=0.0)
    oy = tl.load(prm + 14 + q, mask=live, other=0.0)
    tw = tl.load(prm + 18 + q, mask=live, other=0.0)
    th = tl.load(prm + 22 + q, mask=live, other=0.0)
    tile = tl.load(tiles_ptr + b * 4 + q, mask=live, other=0)
    lx = sx - ox
    ly = sy - oy
    inside = live & on_canvas & (lx >= -0.5) & (lx < tw - 0.5) & (ly >= -0.5) & (ly < th - 0.5)

    # bilinear with border padding over the tile's S x S slot (grid_sample, align_corners=False)
    cx = tl.minimum(tl.maximum(lx, 0.0), S - 1.0)
    cy = tl.minimum(tl.maximum(ly, 0.0), S - 1.0)
    x0f = tl.floor(cx)
    y0f = tl.floor(cy)
    fx = cx - x0f
    fy = cy - y0f
    x0 = x0f.to(tl.int32)
    y0 = y0f.to(tl.int32)
    x1 = tl.minimum(x0 + 1, S - 1)
    y1 = tl.minimum(y0 + 1, S - 1)
    base = cache_ptr + tile * npix * 3
    i00 = (y0 * S + x0) * 3
    i01 = (y0 * S + x1) * 3
    i10 = (y1 * S + x0) * 3
    i11 = (y1 * S + x1) * 3
    w00 = (1 - fx) * (1 - fy)
    w01 = fx * (1 - fy)
    w10 = (1 - fx) * fy
    w11 = fx * fy
    r = w00 * tl.load(base + i00, mask=inside, other=0).to(tl.float32)
    r += w01 * tl.load(base + i01, mask=inside, other=0).to(tl.float32)
    r += w10 * tl.load(base + i10, mask=inside, other=0).to(tl.float32)
    r += w11 * tl.load(base + i11, mask=inside, other=0).to(tl.float32)
    g = w00 * tl.load(base + i00 + 1, mask=inside, other=0).to(tl.float32)
    g += w01 * tl.load(base + i01 + 1, mask=inside, other=0).to(tl.float32)
    g += w10 * tl.load(base + i10 + 1, mask=inside, other=0).to(tl.float32)
    g += w11 * tl.load(base + i11 + 1, mask=inside, other=0).to(tl.float32)
    bl = w00 * tl.load(base + i00 + 2, mask=inside, other=0).to(tl.float32)
    bl += w01 * tl.load(base + i01 + 2, mask=inside, other=0).to(tl.float32)
    bl += w10 * tl.load(base + i10 + 2, mask=inside, other=0).to(tl.float32)
    bl += w11 * tl.load(base + i11 + 2, mask=inside, other=0).to(tl.float32)
    r = tl.where(inside, r, pad)
    g = tl.where(inside, g, pad)
    bl = tl.where(inside, bl, pad)

    if HSV:  # device_augment._hsv's formulas, per pixel
        r = r / 255
        g = g / 255
        bl = bl / 255
        v = tl.maximum(tl.maximum(r, g), bl)
        delta = v - tl.minimum(tl.minimum(r, g), bl)
        sat = tl.where(v > 0, delta / tl.maximum(v, 1e-8), 0.0)
        d = tl.maximum(delta, 1e-8)
        h_r = (g - bl) / d
        h_r = h_r - tl.floor(h_r / 6) * 6
        hue = tl.where(v == r, h_r, tl.where(v == g, (bl - r) / d + 2, (r - g) / d + 4))
        hue = tl.where(delta > 0, hue / 6, 0.0) + tl.load(prm + 26)
        hue = hue - tl.floor(hue)
        sat = tl.minimum(tl.maximum(sat * (1 + tl.load(prm + 27)), 0.0), 1.0)
        v = tl.minimum(tl.maximum(v * (1 + tl.load(prm + 28)), 0.0), 1.0)
        k = 5 + hue * 6
        k = k - tl.floor(k / 6) * 6
        r = (v - v * sat * tl.minimum(tl.maximum(tl.minimum(k, 4 - k), 0.0), 1.0)) * 255
        k = 3 + hue * 6
        k = k - tl.floor(k / 6) * 6
        g = (v - v * sat * tl.minimum(tl.maximum(tl.minimum(k, 4 - k), 0.0), 1.0)) * 255
        k = 1 + hue * 6
        k = k - tl.floor(k / 6) * 6
        bl = (v - v * sat * tl.minimum(tl.maximum(tl.minimum(k, 4 - k), 0.0), 1.0)) * 255

    dst = out_ptr + (b * npix + p) * 3
    tl.store(dst, tl.minimum(tl.maximum(tl.floor(r + 0.5), 0.0), 255.0).to(tl.uint8), mask=live)
    tl.store(dst + 1, tl.minimum(tl.maximum(tl.floor(g + 0.5), 0.0), 255.0).to(tl.uint8), mask=live)
    tl.store(dst + 2, tl.minimum(tl.maximum(tl.floor(bl + 0.5), 0.0), 255.0).to(tl.uint8), mask=live)


def pack_params(
    minv: torch.Tensor,
    canvas: torch.Tensor,
    centre: torch.Tensor,
    origin: torch.Tensor,
    sizes: torch.Tensor,
    gains: torch.Tensor | None,
) -> torch.Tensor:
    """[B, N_PARAMS] float32 rows, in the kernel's order: inverse affine's top two rows [0:6] (output pixel -> canvas),
    canvas (w, h) [6:8], mosaic centre [8:10], tile origins x [10:14] and y [14:18], tile widths [18:22] and heights
    [22:26] (0 for inactive tiles), HSV gains [26:29] (zeros when gains is None)."""
    b = minv.shape[0]
    hsv = gains if gains is not None else torch.zeros(b, 3, device=minv.device)
    cols = [minv[:, :2, :].reshape(b, 6), canvas, centre, origin[..., 0], origin[..., 1], sizes[..., 0], sizes[..., 1]]
    return torch.cat([*cols, hsv], 1).float().contiguous()


def warp_hsv(images: torch.Tensor, tiles: torch.Tensor, params: torch.Tensor, hsv: bool, pad: float) -> torch.Tensor:
    """Augmented uint8 batch [B, 3, S, S] (channels_last memory) from the cache [N, S, S, 3]."""
    b, s = tiles.shape[0], images.shape[1]
    out = torch.empty((b, s, s, 3), dtype=torch.uint8, device=images.device)
    grid = (b, triton.cdiv(s * s, BLOCK))
    triton_kernels.launcher(_warp_hsv, images.device.type == "cpu")[grid](
        images, tiles.contiguous(), params, out, s, pad, N_PARAMS=N_PARAMS, HSV=hsv, BLOCK=BLOCK
    )
    return out.permute(0, 3, 1, 2)

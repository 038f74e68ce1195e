"""yolo_ray's Triton kernels compile for GPUs, on a machine without one: Triton compiles them ahead of time to a
cubin for a named target, with the ptxas its wheel carries. The interpreter tests run the kernels' logic on the CPU;
only the compiler refuses what it cannot compile (2026-12-07: the NMS kernel's arguments, annotated `Any`, ran in
the interpreter and failed its first compile on an H100)."""

from __future__ import annotations

from typing import Any

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from yolo_ray import triton_kernels
from yolo_ray.data import augment_kernel
from yolo_ray.worker import nms_kernel

pytestmark = pytest.mark.skipif("nvidia" not in triton.backends.backends, reason="this Triton has no NVIDIA backend")

ARCHS = [80, 90]  # A100; H100 and H200


def _compile(jit: Any, signature: dict[str, str], constexprs: dict[str, Any], arch: int, warps: int) -> bytes:
    src = ASTSource(fn=jit, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps}).asm["cubin"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block", [nms_kernel.MIN_BLOCK, nms_kernel.MAX_BOXES])
def test_the_nms_kernel_compiles_for_a_gpu(arch: int, block: int) -> None:
    """As greedy_nms_per_image launches it: float32 boxes, int32 counts, int8 flags, k (not specialized: one
    variant for every round's box count), the IoU threshold."""
    jit = nms_kernel.launcher(interpret=False)
    assert [p.name for p in jit.params if p.do_not_specialize] == ["k"]
    signature = {"boxes_ptr": "*fp32", "counts_ptr": "*i32", "removed_ptr": "*i8", "k": "i32", "iou_thres": "fp32",
                 "BLOCK": "constexpr"}  # fmt: skip
    assert _compile(jit, signature, {"BLOCK": block}, arch, warps=8)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("hsv", [True, False])
def test_the_augmentation_kernel_compiles_for_a_gpu(arch: int, hsv: bool) -> None:
    """As warp_hsv launches it: the uint8 cache, int64 tiles, float32 parameters, the uint8 output, size and pad."""
    jit = triton_kernels.launcher(augment_kernel._warp_hsv, False)
    signature = {"cache_ptr": "*u8", "tiles_ptr": "*i64", "params_ptr": "*fp32", "out_ptr": "*u8", "S": "i32",
                 "pad": "fp32", "N_PARAMS": "constexpr", "HSV": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
    constexprs = {"N_PARAMS": augment_kernel.N_PARAMS, "HSV": hsv, "BLOCK": augment_kernel.BLOCK}
    assert _compile(jit, signature, constexprs, arch, warps=4)

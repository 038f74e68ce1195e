"""benchmarks/nms_kernel_probe.py on the CPU (its Triton kernel in the interpreter): greedy NMS with one program per
image keeps what torchvision keeps of each image, on boxes crowded enough that most are suppressed, with an empty
image and padded rows; the probe itself finds no image that differs from the batched validator's calls, and the
validator's NMS gives the same detections with its rounds in the kernel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision

from yolo_ray import triton_kernels

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from nms_kernel_probe import greedy_nms_per_image, torchvision_keep  # noqa: E402

# the CPU tests only: the GPU test compiles the kernel (a module-wide mark skipped it on the GPU image's Triton 3.6)
in_interpreter = pytest.mark.skipif(not triton_kernels.interpreter_takes_loaded_scalars(),
                                    reason="Triton's interpreter before 3.7 cannot run the NMS kernel")  # fmt: skip


def _crowded(counts: list[int], k: int, seed: int = 0) -> torch.Tensor:
    """[len(counts), k, 4] xyxy: each image's boxes jittered around 4 centres, two classes apart (as class offsets)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(len(counts), k, 4)
    for b, n in enumerate(counts):
        centre = torch.rand(4, 2, generator=g)[torch.randint(0, 4, (n,), generator=g)] * 200 + 50
        half = 15 + torch.rand(n, 2, generator=g) * 5
        xy = centre + torch.randn(n, 2, generator=g) * 3
        cls = torch.randint(0, 2, (n, 1), generator=g).float() * 7680  # Ultralytics' per-class offset
        out[b, :n] = torch.cat([xy - half, xy + half], 1) + cls
    return out


@in_interpreter
def test_one_program_per_image_keeps_what_torchvision_keeps() -> None:
    counts = [60, 0, 41, 64]
    boxes, n = _crowded(counts, 64), torch.tensor(counts)
    for iou in (0.45, 0.7):
        got = greedy_nms_per_image(boxes, n, iou)
        for b, c in enumerate(counts):  # torchvision on each image alone, in the given order (descending scores)
            want = torch.zeros(64, dtype=torch.bool)
            want[torchvision.ops.nms(boxes[b, :c], -torch.arange(c, dtype=torch.float32), iou)] = True
            assert torch.equal(got[b], want), (iou, b)
        assert torch.equal(got, torchvision_keep(boxes, n, iou))  # and what the batched validator's calls keep
        kept = got.sum(1)
        assert 1 < int(kept[0]) < counts[0] // 2 and int(kept[1]) == 0  # crowded: most boxes go; empty: none


@in_interpreter
def test_the_probe_finds_no_image_that_differs(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    args = ["benchmarks/nms_kernel_probe.py", "--images", "2", "--k", "128", "--repeats", "1", "--out", str(out)]
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True, capture_output=True, timeout=300)
    got = json.loads(out.read_text())
    assert got["images_differing"] == 0 and got["boxes_per_image"] == 128 and len(got["kernel_s"]) == 1
    assert got["batched_nms_same_detections"] and len(got["batched_nms_kernel_s"]) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles the kernel for a GPU")
def test_every_round_of_the_validator_runs_one_compiled_variant() -> None:
    """Once warmed (batched_val.warm_kernel: one box), rounds of any size up to NMS_PREFIX boxes an image compile
    nothing more: a compile in a validation is ~0.6 s on the training GPU's critical path."""
    from yolo_ray.worker import batched_val, nms_kernel

    device = torch.device("cuda")
    batched_val.warm_kernel(device)
    jit = nms_kernel.launcher(interpret=False)  # the object the validator launches: its compiled variants

    def variants() -> int:
        return sum(len(caches[0]) for caches in jit.device_caches.values())

    compiled = variants()
    assert compiled >= 1 and batched_val.KERNEL_DEVICES == ("cuda",)  # it compiled, and did not fail
    for k in (1, 17, 100, 640, 1024, 1500, batched_val.NMS_PREFIX):
        counts = [k, 0, max(1, k // 3)]
        boxes, n = _crowded(counts, k).to(device), torch.tensor(counts, device=device)
        got = nms_kernel.greedy_nms_per_image(boxes, n, 0.7)
        assert torch.equal(got.cpu(), torchvision_keep(boxes.cpu(), n.cpu(), 0.7)), k
    assert variants() == compiled

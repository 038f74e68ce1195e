"""Export trained weights (never the DDP wrapper: best.pt holds the plain EMA model) and check ONNX against PyTorch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

# fp32 ONNX vs fp32 PyTorch on CPU: the same graph, so only operator-order rounding differs. Box coordinates are in
# pixels (up to imgsz) and class scores in [0, 1]; 1e-3 relative to each output's scale leaves room for rounding
# and none for a wrong export.
ONNX_RTOL = 1e-3


def export(weights: str | Path, formats: list[str], imgsz: int, out_dir: str | Path | None = None) -> dict[str, str]:
    """Export a .pt to each format with Ultralytics; returns {format: path}. ONNX is dynamic (any batch)."""
    from ultralytics import YOLO

    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    paths = {}
    for fmt in formats:
        kwargs: dict[str, Any] = {"format": fmt, "imgsz": imgsz, "device": "cpu"}
        if fmt == "onnx":
            kwargs.update(simplify=False, dynamic=True)
        path = Path(YOLO(str(weights)).export(**kwargs))
        if out_dir is not None:
            target = Path(out_dir) / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            path.replace(target)
            path = target
        paths[fmt] = str(path)
    return paths


def letterbox_batch(images: list[Path], imgsz: int) -> np.ndarray:
    """Images as the exported model takes them: RGB, letterboxed to imgsz, NCHW float32 in [0, 1]."""
    import cv2

    batch = []
    for path in images:
        img = cv2.imread(str(path))
        h, w = img.shape[:2]
        r = imgsz / max(h, w)
        img = cv2.resize(img, (round(w * r), round(h * r)))
        canvas = np.full((imgsz, imgsz, 3), 114, np.uint8)
        canvas[: img.shape[0], : img.shape[1]] = img
        batch.append(canvas[:, :, ::-1].transpose(2, 0, 1))
    return np.ascontiguousarray(np.stack(batch), dtype=np.float32) / 255.0


def check_onnx(weights: str | Path, onnx_path: str | Path, images: list[Path], imgsz: int) -> dict[str, Any]:
    """Run PyTorch and onnxruntime on the same images; report the largest deviation per output scale."""
    import onnxruntime as ort
    import torch
    from ultralytics.nn.tasks import load_checkpoint

    x = letterbox_batch(images, imgsz)
    model, _ = load_checkpoint(str(weights))
    model = model.float().eval()
    with torch.no_grad():
        ref = model(torch.from_numpy(x))
    while isinstance(ref, (list, tuple)):  # eval outputs: (predictions, extras); segment nests one more level
        ref = ref[0]
    ref = ref.numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: x})[0]
    scale = float(np.abs(ref).max()) or 1.0
    max_abs = float(np.abs(out - ref).max())
    result = {
        "images": len(images),
        "imgsz": imgsz,
        "output_shape": list(out.shape),
        "max_abs_diff": max_abs,
        "output_scale": scale,
        "rtol": ONNX_RTOL,
        "ok": bool(out.shape == ref.shape and max_abs <= ONNX_RTOL * scale),
    }
    return result


def export_and_check(weights: Path, val_images: list[Path], imgsz: int, out_dir: Path) -> dict[str, Any]:
    """What rank 0 does after training: best.pt -> model.onnx, checked on a few val images; writes check.json."""
    onnx_path = out_dir / "model.onnx"
    Path(export(weights, ["onnx"], imgsz, out_dir)["onnx"]).replace(onnx_path)
    check = check_onnx(weights, onnx_path, val_images, imgsz)
    check["onnx"] = str(onnx_path)
    (out_dir / "check.json").write_text(json.dumps(check, indent=2))
    if not check["ok"]:
        raise RuntimeError(f"ONNX export of {weights} deviates from PyTorch: {check}")
    return check

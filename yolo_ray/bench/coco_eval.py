"""An independent scorer for a trained detector: pycocotools' COCOeval on the val split, beside Ultralytics' own mAP.

The ground truth is built here from the YOLO label files and the images' own sizes (not from Ultralytics' dataset
code), and matched by pycocotools; only the detections come from Ultralytics' validator (its letterbox, NMS at
conf 0.001 and IoU 0.7, boxes scaled back to each image's pixels). Two scorers that agree to ~1e-3 on mAP50-95 rule
out a bug in either's matching, and COCO's AP by object size (small < 32^2 px, medium < 96^2, large) shows where a
pipeline loses accuracy.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import yaml
from PIL import Image

from yolo_ray.data.checks import split_images


def val_images(data_yaml: Path) -> list[Path]:
    """The val split's images, found as the driver's dataset checks find them (a folder, a .txt list or a list)."""
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    return split_images(data_yaml, "val")


def ground_truth(data_yaml: Path) -> dict[str, Any]:
    """COCO ground truth from YOLO labels: one image per val image (id = its index), one annotation per label line,
    boxes in the image's own pixels, area = box area (no masks), category = class id + 1 (Ultralytics' map)."""
    paths = val_images(data_yaml)  # sets Ultralytics up before its first import
    from ultralytics.data.utils import img2label_paths

    names = yaml.safe_load(data_yaml.read_text())["names"]
    n_classes = len(names)
    images, annotations = [], []
    for image_id, path in enumerate(paths):
        with Image.open(path) as im:  # the header's size: the image as stored, no decode
            w, h = im.size
        images.append({"id": image_id, "file_name": path.name, "width": w, "height": h})
        label = Path(img2label_paths([str(path)])[0])
        for line in label.read_text().splitlines() if label.exists() else []:
            if not line.strip():
                continue
            c, x, y, bw, bh = (float(v) for v in line.split()[:5])
            box = [(x - bw / 2) * w, (y - bh / 2) * h, bw * w, bh * h]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(c) + 1,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    categories = [{"id": i + 1, "name": str(i)} for i in range(n_classes)]
    return {"images": images, "annotations": annotations, "categories": categories}


def detections(weights: Path, data_yaml: Path, imgsz: int, device: str, work_dir: Path) -> tuple[list, dict]:
    """(COCO-format detections, Ultralytics' own metrics) from one run of Ultralytics' validator on the val split."""
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    from ultralytics import YOLO

    metrics = YOLO(str(weights)).val(
        data=str(data_yaml),
        imgsz=imgsz,
        batch=32,
        device=device,
        save_json=True,  # writes predictions.json (its own COCO step needs faster-coco-eval: offline, it is skipped)
        plots=False,
        verbose=False,
        project=str(work_dir),
        name="val",
        exist_ok=True,
    )
    preds = json.loads((Path(metrics.save_dir) / "predictions.json").read_text())
    own = {k: float(v) for k, v in metrics.results_dict.items()}
    return preds, {"mAP50-95": own["metrics/mAP50-95(B)"], "mAP50": own["metrics/mAP50(B)"]}


def coco_scores(gt: dict[str, Any], preds: list[dict[str, Any]]) -> dict[str, float | None]:
    """pycocotools' bbox COCOeval: AP (mAP50-95), AP50, AP75, AP by object size, AR at 1/10/100 detections; None
    where the val split has no object of that size (COCOeval's -1)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    ids = {im["file_name"]: im["id"] for im in gt["images"]}
    results = [{**p, "image_id": ids[p["file_name"]]} for p in preds if p["file_name"] in ids]
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its tables
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(results) if results else COCO()
        ev = COCOeval(coco_gt, coco_dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    keys = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large", "AR1", "AR10", "AR100")
    return {k: round(float(v), 5) if v >= 0 else None for k, v in zip(keys, ev.stats[:9], strict=True)}


def score(
    weights: Path, data_yaml: Path, imgsz: int, device: str, work_dir: Path, gt: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Both scorers on one set of weights: Ultralytics' mAP50-95 / mAP50 and COCOeval's, with AP by object size.
    gt: ground_truth(data_yaml), when the caller scores several runs on one split."""
    preds, own = detections(weights, data_yaml, imgsz, device, work_dir)
    coco = coco_scores(gt or ground_truth(data_yaml), preds)
    return {"ultralytics": own, "coco": coco, "scorers_differ_by": round(abs(coco["AP"] - own["mAP50-95"]), 5)}

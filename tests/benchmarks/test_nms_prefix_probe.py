"""benchmarks/nms_prefix_probe.py on the CPU: at a young model's scale (~40,000 candidates an image, cut to max_nms)
NMS tried on each image's most confident boxes first gives the detections of NMS on all of them (its speed is the
probe's figure, benchmarks/results/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_top_boxes_first_gives_whole_image_nms_detections(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    args = ["benchmarks/nms_prefix_probe.py", "--images", "2", "--repeats", "1", "--out", str(out)]
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True, capture_output=True, timeout=300)
    got = json.loads(out.read_text())
    assert got["same_detections"] and got["candidates_per_image"] > 30000
    assert len(got["whole_s"]) == len(got["prefix_s"]) == 1

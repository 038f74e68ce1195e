"""benchmarks/step_probe.py runs end to end on the CPU (single process and two torchrun processes) and writes
its rows; the GPU figures themselves live in benchmarks/results/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["benchmarks/step_probe.py", "--device", "cpu", "--imgsz", "64", "--batches", "4", "--steps", "1"]


def _rows(cmd: list[str], out: Path) -> list[dict]:
    subprocess.run([*cmd, *ARGS, "--json", str(out)], cwd=ROOT, check=True, capture_output=True, timeout=600)
    return json.loads(out.read_text())["rows"]


def test_probe_times_every_piece_of_the_step(tmp_path: Path) -> None:
    (row,) = _rows([sys.executable], tmp_path / "one.json")
    assert row["launcher"] == "none" and row["batch"] == 4 and row["ddp"] == "none"
    for key in ("augment_ms", "augment_reference_ms", "ceiling_step_ms", "plus_clip_ema_ms", "plus_augment_ms"):
        assert row[key] > 0, key
    assert row["ceiling_step_img_s"] == round(4 * 1000 / row["ceiling_step_ms"], 1)


def test_probe_under_torchrun_times_independent_and_both_ddp_steps(tmp_path: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    rows = _rows(torchrun, tmp_path / "two.json")
    assert [(r["processes"], r["ddp"], r["launcher"]) for r in rows] == [
        (2, "none", "torchrun"),
        (2, "ultralytics", "torchrun"),
        (2, "yolo_ray", "torchrun"),
        (2, "yolo_ray_fp16_grads", "torchrun"),
    ]
    assert all(r["ceiling_step_ms"] > 0 for r in rows)
    assert all(r["allreduce_grads_ms"] > 0 for r in rows if r["ddp"] != "none")

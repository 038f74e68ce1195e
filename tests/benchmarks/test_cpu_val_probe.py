"""benchmarks/cpu_val_probe.py on the CPU at toy size: a row per thread count and dtype, each with its speed (the
speeds themselves are the probe's figures, benchmarks/results/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_thread_count_and_dtype_gets_its_speed(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    args = ["benchmarks/cpu_val_probe.py", "--threads", "1,2", "--batch", "1", "--batches", "1", "--out", str(out)]
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["threads"], r["dtype"]) for r in rows] == [(1, "fp32"), (1, "bf16"), (2, "fp32"), (2, "bf16")]
    assert all(r["images_per_s"] > 0 for r in rows)

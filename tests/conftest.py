"""Shared fixtures: generated datasets, a CLI runner, and the 2-worker training run several tests inspect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_ray.data.synth import SynthSpec, generate

REPO = Path(__file__).resolve().parents[1]

# Real Ray and real Ultralytics, kept offline and quiet; token auth off for local test clusters.
ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "YOLO_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}
ENV.pop("RAY_ADDRESS", None)


def yolo_ray(*args: str, cwd: Path, timeout: float = 1200, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m yolo_ray ARGS` as a user would; the combined output is kept next to the run for debugging."""
    proc = subprocess.run(
        [sys.executable, "-m", "yolo_ray", *args],
        cwd=cwd,
        env=env or ENV,
        timeout=timeout,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    (Path(cwd) / f"cli-{abs(hash(args)) % 10**8}.log").write_text(proc.stdout)
    return proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The learnable dataset: 384 train / 76 val images of 3 shapes at 128 px."""
    out = tmp_path_factory.mktemp("shapes")
    generate(out, SynthSpec(images=384, imgsz=128, classes=3, seed=0))
    return out


@pytest.fixture(scope="session")
def shapes_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small set for runs that check mechanics (recovery, multi-node), not learning."""
    out = tmp_path_factory.mktemp("shapes_small")
    generate(out, SynthSpec(images=96, imgsz=64, classes=3, seed=1))
    return out


def small_run(shapes_small: Path, storage: Path, name: str, *extra: str) -> list[str]:
    """Overrides for a quick 2-worker CPU run on the small dataset."""
    return [
        f"data.dir={shapes_small}",
        "data.synthetic.images=96",
        "data.synthetic.imgsz=64",
        "data.synthetic.seed=1",
        "train.imgsz=64",
        "train.batch=16",
        "train.accumulate=1",
        "train.plots=false",
        "train.close_mosaic=0",
        "train.warmup_epochs=1",
        "tracking.enabled=false",  # MLflow has its own tests
        f"run.storage_path={storage}",
        f"run.name={name}",
        *extra,
    ]


# The learning run: the shipped smoke experiment as a user runs it (2 gloo workers on the CPU).
LEARN_EPOCHS = 30


@pytest.fixture(scope="session")
def ddp_run(shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("ddp_run")
    proc = yolo_ray(
        "train",
        str(REPO / "experiments" / "smoke.yaml"),
        f"data.dir={shapes}",
        f"train.epochs={LEARN_EPOCHS}",
        f"run.storage_path={storage}",
        "run.name=learn",
        cwd=storage,
    )
    assert proc.returncode == 0, proc.stdout[-5000:]
    return storage / "learn"

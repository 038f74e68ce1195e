"""The run directory (run.storage_path/run.name): every file and folder a run writes, named here once.

config.yaml           the run's settings, as resolved (a re-run compares its own with them)
data.yaml             the dataset with every path absolute: what the workers read
history.jsonl         one line per epoch whose checkpoint is on storage (summary.py)
summary.json          the run's result, for scripts and people; final_metrics.json: the last validation
progress.json         the epoch in flight, for the driver's console (progress.py)
mlflow.json           the MLflow run this run logs to (tracking/mlflow_runs.py); .driver.lock: the driver holding it
checkpoint_*/         Ray Train's checkpoints: Ultralytics' last.pt and meta.json (epoch, size, metrics)
train/                Ultralytics' own: results.csv, plots, weights/{last,best}.pt
ranks/                each rank's record (rank<R>.json); ranks/stream/: the stream loader's served ids
export/               model.onnx and check.json (ONNX Runtime against PyTorch)
native_epochs.jsonl   `yolo-ray train --native`: plain Ultralytics' epochs, timed
"""

from __future__ import annotations

from pathlib import Path

CONFIG = "config.yaml"
DATA_YAML = "data.yaml"
HISTORY = "history.jsonl"
SUMMARY = "summary.json"
FINAL_METRICS = "final_metrics.json"
PROGRESS = "progress.json"
MLFLOW_STATE = "mlflow.json"
DRIVER_LOCK = ".driver.lock"
NATIVE_EPOCHS = "native_epochs.jsonl"
CHECKPOINTS = "checkpoint_*"  # Ray Train names them checkpoint_<time>


def run_dir(storage_path: str | Path, name: str) -> Path:
    return (Path(storage_path).expanduser() / name).resolve()


def weights(run: Path) -> Path:
    """Ultralytics' weights folder: last.pt (rewritten every epoch) and best.pt."""
    return run / "train" / "weights"


def export(run: Path) -> Path:
    return run / "export"


def ranks(run: Path) -> Path:
    return run / "ranks"


def stream_records(run: Path) -> Path:
    return ranks(run) / "stream"


def checkpoints(run: Path) -> list[Path]:
    return sorted(run.glob(CHECKPOINTS))

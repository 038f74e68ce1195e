"""summary.json: the machine-readable result of a run, for scripts, CI and people."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from yolo_ray import run_layout as layout
from yolo_ray.metrics import scores


def append_history(run_dir: Path, metrics: dict[str, Any]) -> None:
    """One line per reported epoch, written by rank 0 (a resumed attempt appends after the last good epoch)."""
    with open(run_dir / layout.HISTORY, "a") as f:
        f.write(json.dumps({"time": time.time(), **metrics}) + "\n")


def write_history(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Replace history.jsonl with these rows, atomically (a reader sees the old file or the new one)."""
    tmp = run_dir / (layout.HISTORY + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(run_dir / layout.HISTORY)


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / layout.HISTORY)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One dict per line; an absent file reads as no lines."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def newest_checkpoint(dirs: list[Path]) -> tuple[int, Path] | None:
    """(epoch, directory) of the newest complete epoch checkpoint among `dirs`: its meta.json (written last, by
    worker/epoch_reporter.py) names the epoch and last.pt's size; one partly written or partly copied is passed over."""
    best: tuple[int, Path] | None = None
    for d in dirs:
        try:
            meta = json.loads((d / "meta.json").read_text())
            complete = (d / "last.pt").stat().st_size == meta["last_pt_bytes"]
        except (OSError, KeyError, ValueError):
            continue
        if complete and (best is None or meta["epoch"] > best[0]):
            best = (meta["epoch"], d)
    return best


def _ranks(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(layout.ranks(run_dir).glob("rank*.json"))]


def write_summary(
    run_dir: Path,
    cfg: Any,
    scaling: Any,
    started: float,
    status: str,
    checkpoint: str | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    history = read_history(run_dir)
    final_file = run_dir / layout.FINAL_METRICS
    final = json.loads(final_file.read_text()) if final_file.exists() and status == "finished" else {}
    steady = [h["images_per_s"] for h in history[1:]] or [h["images_per_s"] for h in history]
    ranks = _ranks(run_dir)
    best = layout.weights(run_dir) / "best.pt"
    summary = {
        "status": status,
        "run_name": cfg.run.name,
        "run_dir": str(run_dir),
        "config": cfg.source,
        "final": scores(final),
        "task": final.get("task"),
        "epochs_completed": max((h["epoch"] for h in history), default=0),
        "epochs": cfg.train.epochs,
        "world_size": history[-1].get("world_size", scaling.num_workers) if history else scaling.num_workers,
        "nodes": len({r["node_ip"] for r in ranks}) if ranks else None,
        "use_gpu": scaling.use_gpu,
        "global_batch": cfg.train.batch,
        "per_worker_batch": history[-1].get("per_worker_batch") if history else cfg.train.batch // scaling.num_workers,
        "restarts": sum(1 for h in history if h.get("epoch") == h.get("resumed_from_epoch", -2) + 1),
        "checkpoint": checkpoint,
        "best_weights": str(best) if best.exists() else None,
        "wall_time_s": round(time.time() - started, 2),
        "throughput_images_per_s": round(statistics.median(steady), 2) if steady else None,
        "error": error,
    }
    if getattr(scaling, "elastic", False):  # each epoch's group size: where it resized
        summary["world_sizes"] = [h.get("world_size") for h in history]
    (run_dir / layout.SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary

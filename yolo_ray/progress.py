"""A run's progress as the user sees it: one line per epoch, and on a terminal one progress bar.

Rank 0 writes where its epoch stands to progress.json in the run directory (at most twice a second: a small file
replaced atomically) and each finished epoch to history.jsonl (worker/loop.py). The driver follows both files
and prints: the epoch lines always (they are what `ray job submit` logs and CI keep), and, when its stdout is a
terminal, one bar for the epoch in flight. The run directory is shared storage on a cluster, so this works wherever
the driver runs; nothing crosses Ray for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from yolo_ray import run_layout as layout
from yolo_ray.console import TRAINING_STARTS
from yolo_ray.summary import read_history

PROGRESS = layout.PROGRESS
SHOWN = (
    "train/box_loss",
    "train/seg_loss",
    "train/pose_loss",
    "train/cls_loss",
    "train/loss",
    "precision",
    "recall",
    "mAP50",
    "mAP50-95",
    "mask_mAP50-95",
    "pose_mAP50-95",
    "top1",
    "top5",
    "lr/pg0",
    "images_per_s",
)  # fmt: skip  (each task's own: a row holds only its task's keys)


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    return f"[yolo_ray] epoch {row['epoch']}/{epochs} " + " ".join(f"{k}={_fmt(row[k])}" for k in SHOWN if k in row)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------------------------------- worker side


class ProgressWriter:
    """Rank 0's Ultralytics callbacks that keep progress.json current: epoch, batch of batches, running losses."""

    def __init__(self, run_dir: Path, every_s: float = 0.5):
        self.path, self.every_s = run_dir / PROGRESS, every_s
        self._last = 0.0
        self._batch = 0  # Ultralytics counts batches in a local of its loop only

    def attach(self, trainer: Any) -> None:
        trainer.add_callback("on_train_epoch_start", self._epoch_start)
        trainer.add_callback("on_train_batch_end", self._batch_end)
        trainer.add_callback("on_train_epoch_end", lambda t: self._write(t, "val"))

    def _epoch_start(self, trainer: Any) -> None:
        self._batch = 0
        self._write(trainer, "train")

    def _batch_end(self, trainer: Any) -> None:
        self._batch += 1
        if time.monotonic() - self._last >= self.every_s:  # reading the losses syncs the device: rarely
            self._write(trainer, "train")

    def _write(self, trainer: Any, phase: str) -> None:
        self._last = time.monotonic()
        losses = {}
        if trainer.tloss is not None and phase == "train" and self._batch:
            losses = {k: round(float(v), 4) for k, v in trainer.label_loss_items(trainer.tloss, "train").items()}
        state = {
            "epoch": trainer.epoch + 1,
            "epochs": trainer.epochs,
            "batch": self._batch,
            "batches": len(trainer.train_loader),
            "phase": phase,
            "losses": losses,
        }
        tmp = self.path.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # progress is a courtesy: never fail training for it
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)


# --------------------------------------------------------------------------------------------------- driver side


class EpochConsole:
    """The driver's follower of a run directory: prints each new history.jsonl row as an epoch line, and on a
    terminal draws a bar from progress.json. Start it before training, stop it after (stop prints what is left)."""

    def __init__(
        self, run_dir: Path, epochs: int, tty: bool | None = None, every_s: float = 0.25, started: float | None = None
    ):
        """started: the run's start (time.time()); when given, one line says when the training loop started (rank 0's
        first progress.json): what the silent start-up (Ray, workers, model, data) took."""
        self.run_dir, self.epochs, self.every_s, self.started = run_dir, epochs, every_s, started
        self.tty = sys.stdout.isatty() if tty is None else tty
        self._printed = len(read_history(run_dir))  # a resumed run's earlier epochs were printed back then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="yolo_ray-console")
        self._bar: Any = None
        self._bar_epoch = 0

    def start(self) -> EpochConsole:
        (self.run_dir / PROGRESS).unlink(missing_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()
        self._close_bar()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(OSError, ValueError):  # a file caught mid-write: the next poll reads it
                self._poll()

    def _poll(self) -> None:
        if self.started is not None and (self.run_dir / PROGRESS).exists():
            took = time.time() - self.started
            self._print(f"{TRAINING_STARTS} {took:.1f} s after the run started (Ray, workers, model, data)")
            self.started = None  # once: a restarted group's loop is not a new start-up
        rows = read_history(self.run_dir)
        for row in rows[self._printed :]:
            self._print(epoch_line(row, self.epochs))
        self._printed = max(self._printed, len(rows))
        if self.tty:
            self._draw(self.run_dir / PROGRESS)

    def _print(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line)
        else:
            print(line, flush=True)

    def _draw(self, path: Path) -> None:
        if not path.exists():
            return
        state = json.loads(path.read_text())
        if state["epoch"] != self._bar_epoch:
            self._close_bar()
            from tqdm import tqdm

            self._bar = tqdm(total=state["batches"], desc=f"epoch {state['epoch']}/{state['epochs']}", leave=False)
            self._bar_epoch = state["epoch"]
        self._bar.n = state["batch"]
        losses = " ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in state["losses"].items())
        self._bar.set_postfix_str("validating" if state["phase"] == "val" else losses, refresh=False)
        self._bar.refresh()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> EpochConsole:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

"""Ultralytics process setup: offline, quiet integrations. Call before (and right after) importing ultralytics.

Ultralytics reads RANK/LOCAL_RANK/WORLD_SIZE once at import and switches its own MLflow and Ray Tune callbacks on
whenever those packages import. Under yolo_ray it must be imported inside the Ray worker (after Ray set the rank
variables), never download anything, and leave logging to yolo_ray.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Ultralytics integrations that would log a second copy of each run (or call ray.train.report behind our back).
INTEGRATIONS = ("mlflow", "raytune", "clearml", "comet", "dvc", "tensorboard", "wandb", "sync")


def set_offline_env(config_dir: str | Path | None = None, verbose: bool = True) -> None:
    """Environment for an offline Ultralytics: no downloads, no pip, a private settings dir per process; verbose
    false: only its warnings and errors (a Ray worker's start-up chatter, tables and bars stay out of the user's
    terminal; the driver prints one line per epoch)."""
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_AUTOINSTALL"] = "false"
    os.environ["YOLO_VERBOSE"] = str(verbose).lower()
    if config_dir is None:  # one dir per process: concurrent ranks must not race on one settings.json
        _remove_dead_settings_dirs()
        config_dir = Path(tempfile.gettempdir()) / f"{SETTINGS_PREFIX}{os.getpid()}"
        atexit.register(shutil.rmtree, config_dir, ignore_errors=True)
    Path(config_dir).mkdir(parents=True, exist_ok=True)
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)


SETTINGS_PREFIX = "ultralytics-settings-"


def _remove_dead_settings_dirs() -> None:
    """Per-process settings dirs of processes that are gone (killed workers skip atexit)."""
    import psutil

    for d in Path(tempfile.gettempdir()).glob(f"{SETTINGS_PREFIX}*"):
        pid = d.name.removeprefix(SETTINGS_PREFIX)
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def disable_integrations() -> None:
    """Turn off Ultralytics' own loggers; yolo_ray reports metrics and checkpoints itself."""
    from ultralytics.utils import SETTINGS

    SETTINGS.update({k: False for k in INTEGRATIONS if k in SETTINGS})


def quiet_progress_bars() -> None:
    """Ultralytics' progress bars print their final line only (its mode for CI consoles). In a Ray worker stdout is
    a pipe that Ray forwards line by line, so each redraw of a per-batch bar reached the user as a line of its own:
    ~790 of a 30-epoch smoke run's ~1300 lines. yolo_ray prints one line per epoch itself."""
    from ultralytics.utils import tqdm

    if hasattr(tqdm, "is_noninteractive_console"):  # the seam Ultralytics' TQDM asks at construction
        tqdm.is_noninteractive_console = lambda: True


def setup(verbose: bool = True) -> None:
    """This process's Ultralytics: offline, its own integrations off; verbose false: warnings and errors only (a
    driver that checks inputs with Ultralytics' functions before the workers start prints nothing of its own)."""
    if "ultralytics" not in sys.modules:  # VERBOSE is read once, at Ultralytics' first import
        set_offline_env(verbose=verbose)
    disable_integrations()

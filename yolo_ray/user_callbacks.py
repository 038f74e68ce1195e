"""Users' own Ultralytics callbacks, named in the config and run inside every Ray Train worker.

    train:
      callbacks:
        on_fit_epoch_end: [my_pkg.hooks:log_extra]                       # every rank
        on_train_end: [{fn: my_pkg.hooks:upload, rank0_only: true}]      # rank 0 only

Under Ultralytics' own DDP launcher, callbacks added in Python are lost in the spawned processes. Here every rank runs
Ultralytics' trainer in-process, so a callback named by import path is imported in each worker and added to its
trainer: it sees the trainer as Ultralytics passes it (epoch, metrics, model, save_dir). The driver checks the names
before Ray starts: a known event, a `module:function` path whose module it can find (workers import the same code,
shipped with `ray job submit --working-dir` or installed).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yolo_ray.config_schema import ConfigError


@dataclass(frozen=True)
class UserCallback:
    event: str
    path: str  # "module.sub:function"
    rank0_only: bool = False


@functools.cache
def events() -> frozenset[str]:
    """Ultralytics' callback events, read from its source without importing it (the driver must not import it)."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    base = Path(next(iter(spec.submodule_search_locations))) / "utils" / "callbacks" / "base.py"
    for node in ast.walk(ast.parse(base.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "default_callbacks" for t in node.targets):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return frozenset()


def parse(spec: dict, source: str) -> list[UserCallback]:
    """The `train.callbacks` mapping as UserCallbacks; ConfigError naming the key for anything wrong."""
    known = events()
    out: list[UserCallback] = []
    for event, entries in spec.items():
        key = f"train.callbacks.{event}"
        if known and event not in known:
            raise ConfigError(
                source, key, "is not an Ultralytics callback event.", f"use one of {', '.join(sorted(known))}."
            )
        for entry in entries if isinstance(entries, list) else [entries]:
            path, rank0 = (entry, False) if isinstance(entry, str) else (_get(entry, "fn"), _get(entry, "rank0_only"))
            if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
                raise ConfigError(
                    source,
                    key,
                    f"{entry!r} is not a callback.",
                    "write `module.sub:function`, or {fn: module.sub:function, rank0_only: true}.",
                )
            module = path.split(":")[0]
            if _find(module) is None:
                raise ConfigError(
                    source,
                    key,
                    f"module {module!r} cannot be imported here.",
                    "install it or put it on PYTHONPATH (ray job submit --working-dir ships the current directory).",
                )
            out.append(UserCallback(event, path, bool(rank0)))
    return out


def _get(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, dict) else None


def _find(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that does not exist
        return None


def attach(trainer: Any, callbacks: list[UserCallback], rank: int) -> None:
    """Import each callback in this worker and add it to the trainer (rank0_only ones on rank 0 only)."""
    for cb in callbacks:
        if cb.rank0_only and rank != 0:
            continue
        module, name = cb.path.split(":")
        trainer.add_callback(cb.event, getattr(importlib.import_module(module), name))

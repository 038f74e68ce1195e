"""What the benchmark host's Python does to start-up clocks.

A package installed without byte-compiled files, on a host where Python may not write them
(PYTHONDONTWRITEBYTECODE, as on the GPU machines' image for its torch), is compiled from source by every process that
imports it: each of a yolo_ray run's processes (driver, Ray Train's controller, each worker) then pays for it, where
native Ultralytics' one process pays once. On one H200 a yolo_ray run's start-up went from 56.7 s to 27.6 s once
torch was compiled (the second run also found warm caches; README, Benchmarks). A pip install compiles what it
installs; the benchmark says when the host's packages are not, so its clocks are read for what they are."""

from __future__ import annotations

import importlib.util
import sys

PACKAGES = ("torch", "ray", "ultralytics")


def uncompiled(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The packages that every new process compiles from source: no cached bytecode for their __init__ while this
    Python writes none."""
    if not sys.dont_write_bytecode:
        return []  # the first import writes the cache; later processes read it
    found = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        if not _has_bytecode(spec.origin):
            found.append(name)
    return found


def _has_bytecode(source: str) -> bool:
    try:
        with open(importlib.util.cache_from_source(source), "rb"):
            return True
    except OSError:
        return False


def check() -> list[str]:
    """uncompiled(), said once up front when not empty: the benchmark's JSON records it too."""
    found = uncompiled()
    if found:
        print(warning(found), flush=True)
    return found


def warning(packages: list[str]) -> str:
    return (
        f"[bench] warning: {', '.join(packages)} carry no byte-compiled files and this Python writes none "
        "(PYTHONDONTWRITEBYTECODE): every process compiles them, which inflates yolo_ray's start-up (several "
        "processes) against native's (one). Compile them first: python -m compileall -q -j 0 <site-packages>"
    )

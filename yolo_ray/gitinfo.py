"""The git commit of a directory, for provenance (MLflow tags, benchmark results)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit(cwd: str | Path | None = None) -> str | None:
    """HEAD of the repository that holds cwd (default: the working directory), or None outside one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def dirty(cwd: str | Path | None = None) -> bool | None:
    """Whether tracked files differ from HEAD (what ran is then not the commit alone: a GPU machine gets the landed
    commit and the working tree's changes on top), or None outside a repository."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip())


def provenance(cwd: str | Path | None = None) -> dict[str, str | bool | None]:
    """What a result file says ran: YOLO_RAY_COMMIT when set (a copy without .git), else HEAD and whether the tree
    had changes on top of it."""
    if os.environ.get("YOLO_RAY_COMMIT"):
        return {"commit": os.environ["YOLO_RAY_COMMIT"], "commit_dirty": None}
    return {"commit": commit(cwd), "commit_dirty": dirty(cwd)}

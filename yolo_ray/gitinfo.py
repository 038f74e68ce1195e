"""The git commit of a directory, for provenance (MLflow tags, benchmark results)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit(cwd: str | Path | None = None) -> str | None:
    """HEAD of the repository that holds cwd (default: the working directory), or None outside one."""
    out = _git(cwd, ["rev-parse", "HEAD"], timeout=5)
    return (out or "").strip() or None


def dirty(cwd: str | Path | None = None) -> bool | None:
    """Whether tracked files differ from HEAD (what ran is then not the commit alone: a GPU machine gets the landed
    commit and the working tree's changes on top), or None outside a repository."""
    out = _git(cwd, ["status", "--porcelain", "--untracked-files=no"], timeout=10)
    return None if out is None else bool(out.strip())


def provenance(cwd: str | Path | None = None) -> dict[str, str | bool | None]:
    """What a result file says ran: YOLO_RAY_COMMIT when set (a copy without .git), else HEAD and whether the tree
    had changes on top of it."""
    if os.environ.get("YOLO_RAY_COMMIT"):
        return {"commit": os.environ["YOLO_RAY_COMMIT"], "commit_dirty": None}
    return {"commit": commit(cwd), "commit_dirty": dirty(cwd)}


def _git(cwd: str | Path | None, args: list[str], timeout: float) -> str | None:
    """git's standard output, or None where git is missing, fails (outside a repository) or hangs."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout

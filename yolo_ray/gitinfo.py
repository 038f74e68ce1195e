"""The git commit of a directory, for provenance (MLflow tags, benchmark results)."""

from __future__ import annotations

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

"""Provenance in benchmark results: the commit, and whether the tree that ran had changes on top of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from yolo_ray import gitinfo


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)  # fmt: skip


def test_a_changed_tracked_file_marks_the_commit_dirty(tmp_path: Path) -> None:
    """A GPU machine's copy is the landed commit with the working tree's changes on top: HEAD alone would name a
    commit that is not what ran."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "one")
    head = gitinfo.commit(tmp_path)
    assert head and len(head) == 40 and gitinfo.dirty(tmp_path) is False
    (tmp_path / "new.txt").write_text("untracked\n")  # untracked files are not what ran from the package
    assert gitinfo.dirty(tmp_path) is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert gitinfo.dirty(tmp_path) is True and gitinfo.commit(tmp_path) == head


def test_outside_a_repository_there_is_nothing_to_say(tmp_path: Path) -> None:
    assert gitinfo.commit(tmp_path) is None and gitinfo.dirty(tmp_path) is None


def test_a_commit_given_by_the_environment_wins(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("YOLO_RAY_COMMIT", "abc1234")
    assert gitinfo.provenance(tmp_path) == {"commit": "abc1234", "commit_dirty": None}
    monkeypatch.delenv("YOLO_RAY_COMMIT")
    assert gitinfo.provenance(tmp_path) == {"commit": None, "commit_dirty": None}

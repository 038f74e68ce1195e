"""Users' Ultralytics callbacks (`train.callbacks`), imported and run inside every Ray Train worker under DDP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ENV, small_run, yolo_ray

from yolo_ray import config

HOOKS = """
import json
from pathlib import Path

import torch.distributed as dist


def _mark(trainer, kind):
    out = Path(trainer.save_dir).parent / "hooks"
    out.mkdir(exist_ok=True)
    rank = dist.get_rank() if dist.is_initialized() else 0
    row = {"rank": rank, "epoch": trainer.epoch + 1, "metrics": sorted(trainer.metrics or {})}  # rank 0 validates
    (out / f"{kind}-rank{rank}-epoch{trainer.epoch + 1}.json").write_text(json.dumps(row))


def every_rank(trainer):
    _mark(trainer, "every")


def rank_zero(trainer):
    _mark(trainer, "rank0")
"""


@pytest.fixture(scope="module")
def hooks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("user_hooks")
    (d / "yolo_ray_test_hooks.py").write_text(HOOKS)
    return d


def test_user_callbacks_run_on_every_rank_under_ddp(shapes_small: Path, tmp_path: Path, hooks_dir: Path) -> None:
    """A callback named by import path runs in both workers of a 2-worker DDP run at every epoch end, seeing the
    trainer's epoch and metrics; a rank0_only one runs on rank 0 only."""
    spec = "{on_fit_epoch_end: [yolo_ray_test_hooks:every_rank, {fn: yolo_ray_test_hooks:rank_zero, rank0_only: true}]}"
    args = small_run(shapes_small, tmp_path, "hooks", "train.epochs=2", f"train.callbacks={spec}")
    env = {**ENV, "PYTHONPATH": f"{hooks_dir}:{ENV.get('PYTHONPATH', '')}"}
    proc = yolo_ray("train", *args, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    # Ultralytics fires on_fit_epoch_end once more after its final evaluation of best.pt (epoch index = epochs)
    marks = {p.name for p in (tmp_path / "hooks" / "hooks").glob("*.json")}
    for epoch in (1, 2):
        assert {f"every-rank0-epoch{epoch}.json", f"every-rank1-epoch{epoch}.json"} <= marks, sorted(marks)
        assert f"rank0-rank0-epoch{epoch}.json" in marks, sorted(marks)
    assert not [m for m in marks if m.startswith("rank0-rank1")], sorted(marks)  # rank0_only: never on rank 1
    row = json.loads((tmp_path / "hooks" / "hooks" / "every-rank1-epoch2.json").read_text())
    assert row["rank"] == 1 and row["epoch"] == 2
    row = json.loads((tmp_path / "hooks" / "hooks" / "rank0-rank0-epoch1.json").read_text())
    assert "metrics/mAP50(B)" in row["metrics"]  # rank 0's trainer holds the epoch's validation


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("{on_epoch_done: [os.path:join]}", "not an Ultralytics callback event"),
        ("{on_fit_epoch_end: [os.path.join]}", "module.sub:function"),
        ("{on_fit_epoch_end: [no_such_pkg_xyz.hooks:fn]}", "cannot be imported"),
    ],
)
def test_bad_callbacks_fail_before_ray(spec: str, words: str, tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load(None, [f"train.callbacks={spec}"])
    assert err.value.key.startswith("train.callbacks.") and words in str(err.value)
    proc = yolo_ray("check", f"train.callbacks={spec}", "--no-data", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout

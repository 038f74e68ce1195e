"""train.val_async: each epoch validated by an actor of its own while training goes on (worker/async_val.py)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from conftest import DEVICE_RUN, SharedRay, check_resumed, read_jsonl, small_run, smoke_run, yolo_ray

from yolo_ray.worker.async_val import AWAITING_PREFIX

SCORES = ("mAP50", "mAP50-95", "precision", "recall")
VAL_LOSSES = ("val/box_loss", "val/cls_loss", "val/dfl_loss")


def _by_epoch(run_dir: Path) -> dict[int, dict]:
    history = read_jsonl(run_dir / "history.jsonl")
    epochs = [h["epoch"] for h in history]
    assert epochs == sorted(set(epochs)), f"each epoch's line once, in order: {epochs}"
    return {h["epoch"]: h for h in history}


def _val_batches(shapes: Path, ranks: int, batch: int = 16) -> int:
    """How many val batches the ranks together run (each rank its share of the images, Ultralytics' rank split)."""
    images = len(list((shapes / "val" / "images").iterdir()))
    return ranks * math.ceil(math.ceil(images / ranks) / batch)


def test_async_validation_gives_the_inline_metrics_and_survives_a_failing_validation(
    device_run: Path, shapes: Path, tmp_path: Path, shared_ray: SharedRay
) -> None:
    """The learning run on the device loader, validated on a thread of rank 0 instead of inline, one validation
    failing (epoch 3's, submitted again). Training is untouched by where validation runs (the same weights every
    epoch), so every epoch's scores, the best epoch and the final validation of best.pt match inline's. Inline
    validation on 2 ranks is sharded and averages its loss over each rank's batches; the thread validates the whole
    split in fewer batches: the val losses differ by exactly that count."""
    overrides = (*DEVICE_RUN, "train.val_async=true", "train.val_runner=thread", "run.fail_val_at_epoch=3")
    run_dir, proc = smoke_run(tmp_path, shapes, "async", *overrides, env=shared_ray.env())
    ours, inline = _by_epoch(run_dir), _by_epoch(device_run)
    assert list(ours) == list(inline)
    assert "validation of epoch 3 failed (RuntimeError): submitting it again" in proc.stdout
    ratio = _val_batches(shapes, ranks=2) / _val_batches(shapes, ranks=1)
    for epoch, row in ours.items():
        ref = inline[epoch]
        assert row["saved_weights_sha256"] == ref["saved_weights_sha256"], epoch  # the same training
        for key in SCORES:
            assert abs(row[key] - ref[key]) <= 1e-3, (epoch, key, row[key], ref[key])
        for key in VAL_LOSSES:
            assert math.isclose(row[key], ref[key] * ratio, rel_tol=2e-3), (epoch, key, row[key], ref[key])
        assert 0 <= row["val_lag_epochs"] <= 2 and row["val_s"] > 0
    assert ours[len(ours)]["mAP50-95"] > 0.2  # it learned: the comparison means something
    best = max(ours.values(), key=lambda r: r["fitness"])["epoch"]
    assert best == max(inline.values(), key=lambda r: r["fitness"])["epoch"]
    final = json.loads((run_dir / "final_metrics.json").read_text())
    ref_final = json.loads((device_run / "final_metrics.json").read_text())
    assert abs(final["mAP50-95"] - ref_final["mAP50-95"]) <= 1e-3  # best.pt: the same epoch's weights
    weights = run_dir / "train" / "weights"
    assert not list(weights.glob(f"{AWAITING_PREFIX}*"))  # every kept last.pt promoted or dropped
    with open(run_dir / "train" / "results.csv") as f:  # each row completed when its result came (plots read it)
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == list(ours)
    assert all(abs(float(r["metrics/mAP50-95(B)"]) - ours[int(r["epoch"])]["mAP50-95"]) < 1e-5 for r in rows)


def test_a_restarted_run_validates_the_epochs_whose_results_never_came(
    shapes_small: Path, tmp_path: Path, shared_ray: SharedRay
) -> None:
    """Validation by a Ray actor whose process dies validating epoch 1 (a new actor takes it), and a worker that
    fails after epoch 2's checkpoint, before epoch 2's result was applied: the restarted group resumes at epoch 3 and
    first validates epoch 2 from its kept last.pt; every epoch has one line with its metrics."""
    args = small_run(
        shapes_small, tmp_path, "restart", "train.epochs=4", "train.val_async=true", "train.val_runner=actor"
    )
    # half a CPU per worker (torch still gets one thread each, as with one) leaves this 2-CPU Ray one for the actor
    args += ["run.fail_at_epoch=2", "run.max_failures=1", "scaling.cpus_per_worker=0.5", "run.fail_val_at_epoch=1"]
    proc = yolo_ray("train", *args, cwd=tmp_path, env=shared_ray.env())
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "validation of epoch 1 failed (ActorDiedError): submitting it again" in proc.stdout
    run_dir = tmp_path / "restart"
    assert (run_dir / "train" / "val_async" / ".fault_done").exists()  # the actor's process did die
    check_resumed(run_dir, resumed_from=2, epochs=4)
    rows = _by_epoch(run_dir)
    assert list(rows) == [1, 2, 3, 4]
    assert all(all(k in r for k in VAL_LOSSES) for r in rows.values()), rows
    assert rows[2].get("val_from_kept_checkpoint") == 1.0  # validated by the second attempt
    assert (run_dir / "train" / "weights" / "best.pt").exists()


def test_val_async_needs_room_beside_the_workers(shapes_small: Path, tmp_path: Path, shared_ray: SharedRay) -> None:
    """A validation actor the cluster could never place beside the workers is refused before any worker starts."""
    args = small_run(shapes_small, tmp_path, "noroom", "train.val_async=true", "train.val_runner=actor")
    proc = yolo_ray("train", *args, "scaling.cpus_per_worker=1", cwd=tmp_path, env=shared_ray.env())
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "train.val_cpus" in proc.stdout and "Fix:" in proc.stdout and "Traceback" not in proc.stdout
    assert not (tmp_path / "noroom" / "ranks").exists()

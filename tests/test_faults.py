"""Recovery: a failed run keeps its checkpoints and resumes on re-run; so does one whose driver was killed. (A lost
node restarting the worker group mid-run: tests/test_ray_cluster.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ENV,
    RERUN_EPOCHS,
    RERUN_FAILS_AFTER,
    STAGING_PREFIX,
    MlflowServer,
    Rerun,
    check_resumed,
    kill_tree,
    read_jsonl,
    small_run,
    yolo_ray,
)
from mlflow import MlflowClient

from yolo_ray.faults import FaultPlan, InjectedFault

EPOCHS = 5


def test_fault_plan_fails_once() -> None:
    plan = FaultPlan(epoch=2, rank=1)
    plan.maybe_fail(rank=0, epoch_about_to_start=3, resumed_from=None)  # other rank: no fault
    plan.maybe_fail(rank=1, epoch_about_to_start=2, resumed_from=None)  # too early: no fault
    with pytest.raises(InjectedFault):
        plan.maybe_fail(rank=1, epoch_about_to_start=3, resumed_from=None)
    plan.maybe_fail(rank=1, epoch_about_to_start=3, resumed_from=2)  # the resumed attempt goes on


def test_failure_without_retries_keeps_checkpoints(rerun_after_failure: Rerun) -> None:
    """max_failures=0: the run fails, loses nothing, and the same command resumes it (driver-level resume)."""
    r = rerun_after_failure
    assert r.failed.returncode == 1 and "InjectedFault" in r.failed.stdout
    for said in ("Started a local Ray", "Ultralytics 8", "Starting training for", "Reporting training result"):
        assert said in r.failed.stdout, said  # --verbose: Ray's and Ultralytics' own output as well
    assert r.failed_summary["status"] == "failed"
    assert r.failed_epochs == list(range(1, RERUN_FAILS_AFTER + 1))
    assert r.resumed.returncode == 0, r.resumed.stdout[-5000:]
    check_resumed(r.run_dir, resumed_from=RERUN_FAILS_AFTER, epochs=RERUN_EPOCHS)
    assert not list((r.run_dir / "train" / "weights").glob(f"{STAGING_PREFIX}*"))  # a killed report's staging removed


def test_a_stopped_run_asked_for_more_epochs_is_refused(rerun_after_failure: Rerun) -> None:
    """Ultralytics resumes a run with last.pt's own settings: asked for more epochs, the re-run would train to the
    old count while summary.json said the new one. It exits 2 naming the key and the fix, before Ray starts."""
    longer = rerun_after_failure.longer
    assert longer.returncode == 2 and "Traceback" not in longer.stdout, longer.stdout[-3000:]
    text = " ".join(longer.stdout.split())
    assert "train.epochs" in text and "new run.name" in text and "[yolo_ray] ray:" not in longer.stdout


def test_a_killed_driver_leaves_no_ray_behind_and_resumes_on_rerun(shapes_small: Path, tmp_path: Path) -> None:
    """`kill -9` of the driver alone (as a user or an OOM killer does): its private local Ray goes with it, the
    dashboard and runtime-env agents too (they outlived Ray's own reaper by minutes, ignoring SIGTERM); the same
    command then resumes from the newest checkpoint on storage."""
    import psutil

    # the workers outlive a killed driver by up to the reaper's grace (driver/reaper.py: 5 s), training on at ~1 s an
    # epoch here: given 5 epochs they once finished them all, leaving nothing to resume (2026-12-07, CI on this machine)
    epochs = 16
    args = small_run(shapes_small, tmp_path, "killed", f"train.epochs={epochs}")
    cmd = [sys.executable, "-m", "yolo_ray", "train", *args]
    history = tmp_path / "killed" / "history.jsonl"
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(
            cmd, cwd=tmp_path, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.time() + 600
            while time.time() < deadline and driver.poll() is None:
                if history.exists() and len(read_jsonl(history)) >= 2:
                    break
                time.sleep(0.5)
            ray_processes = psutil.Process(driver.pid).children(recursive=True)
            names = {p.pid: p.name() for p in ray_processes}
            assert driver.poll() is None and any("raylet" in n for n in names.values()), names
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait()
        finally:
            if driver.poll() is None:
                kill_tree(driver.pid)
    left = ray_processes
    for _ in range(60):  # Ray's reaper, then yolo_ray's after its grace
        left = [p for p in left if _alive(p)]
        if not left:
            break
        time.sleep(0.5)
    assert not left, [names[p.pid] for p in left]
    killed_at = max(h["epoch"] for h in read_jsonl(history))
    resumed = yolo_ray("train", *args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-5000:]
    assert "resuming from the epoch-" in resumed.stdout
    history_rows = read_jsonl(history)
    resumed_rows = [h for h in history_rows if h["resumed_from_epoch"] >= 0]
    assert resumed_rows and resumed_rows[0]["resumed_from_epoch"] >= 2
    # It resumes where the killed run got to: its last logged epoch, or one later whose checkpoint was already on
    # storage when the kill came (the line for it is restored from the checkpoint).
    assert resumed_rows[0]["epoch"] == resumed_rows[0]["resumed_from_epoch"] + 1
    assert resumed_rows[0]["resumed_from_epoch"] in (killed_at, killed_at + 1)
    # Resumed from the newest checkpoint on storage: no epoch trained (or reported) twice.
    assert [h["epoch"] for h in history_rows] == list(range(1, epochs + 1))
    assert json.loads((tmp_path / "killed" / "summary.json").read_text())["epochs_completed"] == epochs


def test_killed_after_its_last_checkpoint_a_run_is_finished_once(
    shapes_small: Path, tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    """A driver killed after the last epoch's checkpoint, before the end of the run (final evaluation, summary,
    export, registration): every re-run failed ("training to 3 epochs is finished, nothing to resume"). Now the
    re-run does what was left, once: of two re-runs started together, one finishes the run and the other waits on
    the run lock, then finds it finished and leaves it as it is."""
    args = small_run(
        shapes_small,
        tmp_path,
        "ended",
        "train.epochs=3",
        "tracking.enabled=true",
        f"tracking.uri={mlflow_server.uri}",
        "tracking.model_name=ended-detector",
    )
    run_dir = tmp_path / "ended"
    history = run_dir / "history.jsonl"
    with open(tmp_path / "first.log", "w") as log:
        cmd = [sys.executable, "-m", "yolo_ray", "train", *args]
        driver = subprocess.Popen(
            cmd, cwd=tmp_path, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 600
        while time.time() < deadline and driver.poll() is None:
            if history.exists() and len(read_jsonl(history)) >= 3:
                break
            time.sleep(0.2)
        assert driver.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        kill_tree(driver.pid)
        driver.wait()
    for leftover in ("summary.json", "final_metrics.json"):  # whatever of the end the kill let through
        (run_dir / leftover).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "export", ignore_errors=True)
    logs = [open(tmp_path / f"rerun{i}.log", "w") for i in (1, 2)]
    env = {**ENV, "YOLO_RAY_LOCK_WAIT_S": "300"}  # the waiter outwaits the finisher on this 2-core machine
    reruns = [
        subprocess.Popen(
            [sys.executable, "-m", "yolo_ray", "train", *args],
            cwd=tmp_path,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for f in logs
    ]
    try:
        codes = [p.wait(600) for p in reruns]
    finally:  # a hung re-run must not outlive the test with its Ray
        for p in reruns:
            if p.poll() is None:
                kill_tree(p.pid)
    outputs = [(tmp_path / f"rerun{i}.log").read_text() for i in (1, 2)]
    assert codes == [0, 0], outputs
    finisher, waiter = sorted(outputs, key=lambda o: "already finished" in o)
    assert "every epoch is trained" in finisher and "already finished" in waiter, outputs
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["epochs_completed"] == 3
    assert 0 <= summary["final"]["mAP50-95"] <= 1 and (run_dir / "export" / "model.onnx").is_file()
    assert [h["epoch"] for h in read_jsonl(history)] == [1, 2, 3]  # nothing trained again
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    versions = client.search_model_versions("name = 'ended-detector'")
    assert len(versions) == 1 and client.get_run(versions[0].run_id).info.status == "FINISHED"


def test_history_is_written_back_as_of_the_checkpoint_resumed_from(tmp_path: Path) -> None:
    """A resumed attempt trains again every epoch after its checkpoint: their old lines go, and a line missing for the
    checkpoint's own epoch (killed between persisting it and writing the line) comes from the checkpoint, so the
    history ends with every epoch once (it read [1, 2, 3, 3] after a kill at the last epoch)."""
    from yolo_ray.summary import read_history
    from yolo_ray.worker.loop import reconcile_history

    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoint_x"
    ckpt.mkdir(parents=True)
    (run_dir / "history.jsonl").write_text("".join(json.dumps({"epoch": e, "mAP50": e / 10}) + "\n" for e in (1, 3)))
    (ckpt / "meta.json").write_text(json.dumps({"epoch": 2, "metrics": {"epoch": 2, "mAP50": 0.2}}))
    reconcile_history(run_dir, ckpt)
    assert [(h["epoch"], h["mAP50"]) for h in read_history(run_dir)] == [(1, 0.1), (2, 0.2)]


def test_a_torn_ray_snapshot_is_removed_before_a_resume(tmp_path: Path) -> None:
    """A driver SIGKILLed while Ray Train rewrote checkpoint_manager_snapshot.json left it empty, and the resumed
    sweep trial's controller refused to start (seen in CI); the torn file goes, a whole one stays."""
    from yolo_ray.driver.launcher import RAY_SNAPSHOT, drop_torn_ray_snapshot

    snapshot = tmp_path / RAY_SNAPSHOT
    drop_torn_ray_snapshot(tmp_path)  # none: nothing to do
    snapshot.write_text('{"checkpoint_results": []}')
    drop_torn_ray_snapshot(tmp_path)
    assert snapshot.exists()
    for torn in ("", '{"checkpoint_res'):
        snapshot.write_text(torn)
        drop_torn_ray_snapshot(tmp_path)
        assert not snapshot.exists()


def test_a_kill_while_final_eval_strips_leaves_a_loadable_best(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ultralytics' final_eval rewrote best.pt in place to strip the optimizer; a driver killed mid-write left it
    truncated and the re-run that finishes the run could not load it (seen in CI). The write is now staged and
    renamed: interrupted, the old best.pt loads; completed, the stripped one replaces it."""
    import torch
    import ultralytics.engine.trainer as engine
    from ultralytics.nn.tasks import DetectionModel, torch_safe_load

    from yolo_ray.worker.trainer import _atomic_strip

    best = tmp_path / "best.pt"
    model = DetectionModel("yolo11n.yaml", nc=1, verbose=False)
    torch.save({"model": model, "ema": None, "optimizer": {"state": {}}, "train_args": {}}, best)
    saved = torch.save

    def killed_mid_write(obj: object, f: str) -> None:
        Path(f).write_bytes(b"PK\x03\x04 half a zip")  # what a SIGKILL during torch.save leaves
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt), _atomic_strip():
        engine.strip_optimizer(best)
    monkeypatch.setattr(torch, "save", saved)
    assert torch_safe_load(str(best))[0]["optimizer"] == {"state": {}}  # the old file, whole
    with _atomic_strip():
        engine.strip_optimizer(best)
    assert torch_safe_load(str(best))[0]["optimizer"] is None  # stripped, in place
    assert engine.strip_optimizer.__module__ == "ultralytics.utils.torch_utils"  # unpatched after


def _alive(p: Any) -> bool:
    """Running and not a zombie; a process that ends between the two questions is gone (psutil raises)."""
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

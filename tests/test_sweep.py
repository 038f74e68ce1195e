"""Ray Tune sweeps: Train-inside-Tune trials reporting every epoch, ASHA stopping weak ones, MLflow nesting,
a best config that trains again, no leaked placement groups, and a killed sweep that resumes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ENV, REPO, MlflowServer, SharedRay, kill_tree, small_data, yolo_ray
from mlflow import MlflowClient

from yolo_ray import config
from yolo_ray.config import ConfigError
from yolo_ray.driver import sweep, sweep_space

SWEEP = REPO / "experiments" / "sweep-batch-lr-accumulate.yaml"


def _sweep_args(shapes_small: Path, storage: Path, name: str, *extra: str) -> list[str]:
    # mAP is ~0 for every trial in the first epochs of this tiny budget, so ASHA could not rank trials by it;
    # the validation box loss separates them from epoch 1 on.
    return [
        str(SWEEP),
        *small_data(shapes_small),
        "train.epochs=3",
        "train.close_mosaic=0",
        "train.warmup_epochs=1",
        "tune.metric=val/box_loss",
        "tune.mode=min",
        "tune.num_samples=6",
        "tune.grace_period=1",
        "tune.reduction_factor=3",
        "tune.search=optuna",
        "tune.space={train.batch: {choice: [8, 16]}, train.lr0: {loguniform: [0.00001, 0.05]},"
        " train.accumulate: {choice: [1, 2]}}",
        f"run.storage_path={storage}",
        f"run.name={name}",
        *extra,
    ]


@pytest.fixture(scope="module")
def finished_sweep(
    shapes_small: Path, mlflow_server: MlflowServer, shared_ray: SharedRay, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    storage = tmp_path_factory.mktemp("sweep")
    args = _sweep_args(shapes_small, storage, "asha", f"tracking.uri={mlflow_server.uri}")
    proc = yolo_ray("tune", *args, cwd=storage, env=shared_ray.env())
    assert proc.returncode == 0, proc.stdout[-6000:]
    return storage / "asha"


def test_asha_stops_weak_trials_and_best_is_best(finished_sweep: Path) -> None:
    out = json.loads((finished_sweep / "sweep.json").read_text())
    trials = out["trials"]
    assert len(trials) == 6 and len({t["trial_id"] for t in trials}) == 6
    assert all(t["status"] in ("completed", "stopped early") for t in trials)
    assert any(t["status"] == "stopped early" and t["epochs"] < 3 for t in trials), "ASHA stopped no trial"
    assert all(t["epochs"] >= 1 for t in trials)  # every trial reported per epoch
    best = out["best"]
    assert best["best"] == min(t["best"] for t in trials)  # mode=min
    assert Path(best["weights"]).is_file()
    assert out["placement_groups_left"] == 0
    rows = (finished_sweep / "trials.csv").read_text().splitlines()
    assert len(rows) == 7 and "train.lr0" in rows[0]


def test_best_config_trains_again(finished_sweep: Path, tmp_path: Path, shared_ray: SharedRay) -> None:
    best_yaml = finished_sweep / "best.yaml"
    best = yaml.safe_load(best_yaml.read_text())
    out = json.loads((finished_sweep / "sweep.json").read_text())["best"]
    assert best["train"]["lr0"] == pytest.approx(out["config"]["train.lr0"])
    assert best["train"]["batch"] == out["config"]["train.batch"] and "tune" not in best
    proc = yolo_ray(
        "train",
        str(best_yaml),
        "train.epochs=1",
        "tracking.enabled=false",
        f"run.storage_path={tmp_path}",
        cwd=tmp_path,
        env=shared_ray.env(),
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert json.loads((tmp_path / best["run"]["name"] / "summary.json").read_text())["status"] == "finished"


def test_mlflow_parent_with_one_child_per_trial(finished_sweep: Path, mlflow_server: MlflowServer) -> None:
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    exp = client.get_experiment_by_name("yolo_ray")
    parent = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == "asha"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    pid = parent[0].info.run_id
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{pid}'")
    out = json.loads((finished_sweep / "sweep.json").read_text())
    assert sorted(c.info.run_name for c in children) == sorted(t["trial_id"] for t in out["trials"])
    for child in children:
        trial = next(t for t in out["trials"] if t["trial_id"] == child.info.run_name)
        steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "val/box_loss"))
        assert steps == list(range(1, trial["epochs"] + 1))
        assert child.data.params["train.lr0"]
        assert child.info.status == ("KILLED" if trial["status"] == "stopped early" else "FINISHED")
        assert child.data.tags["best_trial"] == str(trial["trial_id"] == out["best"]["trial_id"]).lower()
    assert parent[0].data.tags["best_trial"] == out["best"]["trial_id"]
    artifacts = {a.path for a in client.list_artifacts(pid)} | {a.path for a in client.list_artifacts(pid, "plots")}
    assert {"trials.csv", "best.yaml", "plots/learning_curves.png", "plots/val_box_loss_vs_train_lr0.png"} <= artifacts


def test_a_pose_sweep_is_scheduled_on_its_keypoint_metric(tmp_path: Path, shared_ray: SharedRay) -> None:
    """Tune's metric may be any task's: ASHA on pose mAP, named as Ultralytics names it (`metrics/mAP50-95(P)`),
    every trial reporting it each epoch (a metric a trial never reported fails the trial in Tune)."""
    args = [
        str(SWEEP),
        "model=yolo11n-pose.yaml",
        f"data.dir={tmp_path / 'pose'}",
        "data.synthetic.images=64",
        "data.synthetic.imgsz=64",
        "data.synthetic.classes=1",
        "train.imgsz=64",
        "train.epochs=2",
        "train.close_mosaic=0",
        "tune.metric=metrics/mAP50-95(P)",
        "tune.num_samples=2",
        "tune.grace_period=1",
        "tune.search=random",
        "tune.space={train.lr0: {loguniform: [0.001, 0.05]}}",
        "tracking.enabled=false",
        f"run.storage_path={tmp_path}",
        "run.name=pose-sweep",
    ]
    proc = yolo_ray("tune", *args, cwd=tmp_path, env=shared_ray.env())
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = json.loads((tmp_path / "pose-sweep" / "sweep.json").read_text())
    assert out["metric"] == "pose_mAP50-95" and len(out["trials"]) == 2
    for trial in out["trials"]:
        assert trial["epochs"] >= 1 and trial["status"] in ("completed", "stopped early"), trial
        assert all(isinstance(h["pose_mAP50-95"], float) for h in trial["history"]), trial["history"]
    assert out["best"]["best"] == max(t["best"] for t in out["trials"])


def test_bad_search_spaces_fail_before_any_trial(tmp_path: Path) -> None:
    def bad(space: str, *extra: str) -> ConfigError:
        with pytest.raises(ConfigError) as err:
            sweep_space.check_space(config.load(SWEEP, [f"tune.space={space}", *extra]))
        return err.value

    assert bad("{train.lr00: {uniform: [0.1, 0.2]}}").key == "tune.space.train.lr00"
    assert "non-empty" in str(bad("{train.batch: {choice: []}}"))
    assert "low 0.2 >= high 0.1" in str(bad("{train.lr0: {uniform: [0.2, 0.1]}}"))
    assert "divide" in str(bad("{train.batch: {choice: [8, 9]}}", "tune.trial.num_workers=2"))
    assert "grid" in str(bad("{train.batch: {grid: [8, 16]}}"))  # grid needs grid/random search, not Optuna
    assert bad("{train.lr0: {uniform: [0.01, 0.02]}}", "tune.metric=metrics/mAP75(M)").key == "tune.metric"
    assert bad("{train.lr0: {uniform: [0.01, 0.02]}}", "train.val_async=true").key == "train.val_async"
    # every task's metric, in Ultralytics' spelling or history.jsonl's: the sweep watches history.jsonl's key
    for given, key in [("metrics/mAP50-95(M)", "mask_mAP50-95"), ("pose_mAP50", "pose_mAP50"),
                       ("metrics/accuracy_top1", "top1"), ("train/seg_loss", "train/seg_loss")]:  # fmt: skip
        cfg = config.load(SWEEP, ["tune.space={train.lr0: {uniform: [0.01, 0.02]}}", f"tune.metric={given}"])
        sweep_space.check_space(cfg)
        assert cfg.tune.metric == key
    proc = yolo_ray("tune", str(SWEEP), "tune.space={train.lr0: {loguniform: [0, 0.1]}}", cwd=tmp_path)
    assert proc.returncode == 2 and "tune.space.train.lr0" in proc.stdout and "Traceback" not in proc.stdout


def test_lr_follows_effective_batch() -> None:
    t = config.load(SWEEP, ["tune.lr_scaling=linear", "tune.reference_batch=16"]).tune
    assert sweep_space.scaled_lr(t, 0.01, 32, 2) == pytest.approx(0.04)
    t = config.load(SWEEP, ["tune.lr_scaling=sqrt", "tune.reference_batch=16"]).tune
    assert sweep_space.scaled_lr(t, 0.01, 64, 1) == pytest.approx(0.02)


def test_killed_sweep_resumes_each_trial_once(shapes_small: Path, tmp_path: Path) -> None:
    args = _sweep_args(
        shapes_small,
        tmp_path,
        "resumable",
        "tune.scheduler=none",
        "tune.num_samples=3",  # two run at once here: at the kill, two trials are mid-run and one not started
        "tune.search=random",
        "tracking.enabled=false",
    )
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "yolo_ray", "tune", *args],
            cwd=tmp_path,
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        trials = tmp_path / "resumable" / "trials"
        deadline = time.time() + 600
        while time.time() < deadline and driver.poll() is None:
            done = [p for p in trials.glob("*/history.jsonl") if len(p.read_text().splitlines()) >= 2]
            if done:
                break
            time.sleep(0.5)
        assert driver.poll() is None, "the sweep ended before it could be killed"
        kill_tree(driver.pid)
        driver.wait()
    proc = yolo_ray("tune", *args, "tune.resume=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "resuming sweep" in proc.stdout
    out = json.loads((tmp_path / "resumable" / "sweep.json").read_text())
    assert len(out["trials"]) == 3 and len({t["trial_id"] for t in out["trials"]}) == 3
    assert all(t["status"] == "completed" and t["epochs"] == 3 for t in out["trials"])
    for history in trials.glob("*/history.jsonl"):  # each epoch of each trial trained and counted once
        epochs = [json.loads(line)["epoch"] for line in history.read_text().splitlines()]
        assert epochs == [1, 2, 3]


def test_elastic_trials_are_counted_at_their_least(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune.trial.num_workers: [min, max]: each trial is an elastic run; the sweep's concurrency counts what a trial
    needs to start (min workers), and a batch choice need not divide by a size the group may take."""
    import ray

    cfg = config.load(
        None,
        [
            "tune.trial.num_workers=[1,2]",
            "tune.trial.cpus_per_worker=1",
            "tune.space={train.batch: {choice: [15, 16]}}",
        ],
    )
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    assert sweep.max_concurrent(cfg, use_gpu=False) == 4
    sweep_space.check_space(cfg)  # 15 is fine for an elastic trial (batch_plan splits it at every size)
    fixed = config.apply(cfg, {"tune.trial.num_workers": 2})
    assert sweep.max_concurrent(fixed, use_gpu=False) == 2
    with pytest.raises(ConfigError, match="does not divide"):
        sweep_space.check_space(fixed)

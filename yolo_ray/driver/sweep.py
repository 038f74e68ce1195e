"""Ray Tune sweeps: every trial is a full yolo_ray training run (Train inside Tune), reported every epoch.

Where a sweep is defined: the `tune:` section of an experiment YAML (search space, metric, search algorithm,
scheduler, per-trial scaling). Each trial trains with `launcher.train` under a name equal to its trial id, so a
restarted trial resumes its own Ray Train checkpoint, and logs an MLflow child run under the sweep's parent run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from yolo_ray import config as config_mod
from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError, ExperimentConfig, TuneSection
from yolo_ray.config_checks import worker_range
from yolo_ray.driver.sweep_results import TrialFollower, report
from yolo_ray.driver.sweep_space import check_space, to_tune_space, trial_config

# --------------------------------------------------------------------------------------------- running it


def _trainable(sampled: dict[str, Any], base: dict, source: str, sweep_dir: str) -> None:
    """One Tune trial: a whole yolo_ray training run whose every epoch report reaches Tune."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from yolo_ray.driver import launcher

    cfg = trial_config(config_mod.from_dict(base, source), sampled, tune.get_context().get_trial_id(), Path(sweep_dir))
    launcher.train(cfg, callbacks=[TuneReportCallback()])


def resolve_trial_cpus(cfg: ExperimentConfig, use_gpu: bool, nodes: list[dict]) -> ExperimentConfig:
    """`tune.trial.cpus_per_worker: auto` as a number, once, on the driver: every trial and the concurrency use it."""
    from yolo_ray.driver import ray_cluster

    tr = cfg.tune.trial
    if tr.cpus_per_worker != "auto":
        return cfg
    cpus = ray_cluster.auto_cpus_per_worker(cfg, use_gpu, nodes, tr.gpus_per_worker)
    return config_mod.apply(cfg, {"tune.trial.cpus_per_worker": cpus})


def max_concurrent(cfg: ExperimentConfig, use_gpu: bool) -> int:
    """Trials the cluster fits at once (Tune does not count the resources of the Train workers inside a trial)."""
    import ray

    if cfg.tune.max_concurrent != "auto":
        return int(cfg.tune.max_concurrent)
    total = ray.cluster_resources()
    tr = cfg.tune.trial
    least = worker_range(tr.num_workers)[0]  # an elastic trial starts with its least workers: counted at that
    fits = int(total.get("CPU", 0) // (least * tr.cpus_per_worker))
    if use_gpu and tr.gpus_per_worker:
        fits = min(fits, int(total.get("GPU", 0) // (least * tr.gpus_per_worker)))
    if fits < 1:
        raise ConfigError(
            cfg.source,
            "tune.trial",
            f"one trial needs {tr.num_workers} worker(s) of "
            f"{tr.cpus_per_worker:g} CPU / {tr.gpus_per_worker:g} GPU; the cluster has {dict(total)}.",
            "lower tune.trial.* or use a larger cluster.",
        )
    return fits


def run(cfg: ExperimentConfig) -> dict[str, Any]:
    """Run (or resume) a sweep; returns {"trials": [...], "best": {...}} and writes the results beside it."""
    from ray import tune

    from yolo_ray import inputs
    from yolo_ray.driver import ray_cluster

    # the MLflow side, loaded before Ray connects, also what it imports later (launcher._fit says why)
    from yolo_ray.tracking import mlflow_runs, mlflow_server, run_record  # noqa: F401

    check_space(cfg)
    inputs.prepare(cfg)  # model and dataset checks (and synthetic generation) before any trial
    sweep_dir = layout.run_dir(cfg.run.storage_path, cfg.run.name)
    uri = mlflow_server.tracking_uri(cfg) if cfg.tracking.enabled else None
    if uri:
        mlflow_server.check(cfg, uri)
    ray_cluster.connect(cfg.run.ray_address, verbose=cfg.run.verbose)
    nodes = ray_cluster.alive_nodes()
    use_gpu = ray_cluster.uses_gpu(cfg, nodes)
    cfg = resolve_trial_cpus(ray_cluster.with_stream_decode(cfg, nodes), use_gpu, nodes)
    base = config_mod.apply(cfg, {"scaling.use_gpu": use_gpu, "data.path": cfg.data.path})
    concurrent = max_concurrent(cfg, use_gpu)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    parent = _parent_run(cfg, uri, sweep_dir) if uri else None

    trainable = tune.with_parameters(_trainable, base=base.to_dict(), source=cfg.source, sweep_dir=str(sweep_dir))
    # The trial driver itself takes no CPU (its Train workers ask for their own); Tune wants a non-empty bundle.
    trainable = tune.with_resources(trainable, {"CPU": 0, "memory": 1})
    tuner = _tuner(cfg, trainable, sweep_dir, concurrent)
    print(
        f"[yolo_ray] sweep {cfg.run.name}: {cfg.tune.num_samples} trials, {concurrent} at a time, metric "
        f"{cfg.tune.metric} ({cfg.tune.mode}), dir {sweep_dir}",
        flush=True,
    )
    follower = TrialFollower(uri, parent, sweep_dir) if uri and parent else None
    if follower:
        follower.start()
    try:
        grid = tuner.fit()
    finally:
        if follower:
            follower.stop()
    out = report(cfg, base, grid, sweep_dir, follower)
    out["placement_groups_left"] = _placement_groups_left()
    if out["placement_groups_left"]:
        print(
            f"[yolo_ray] warning: {out['placement_groups_left']} placement groups are still held after the sweep; "
            "Ray Train frees them through the dashboard's state API: install ray[default] on the head node",
            flush=True,
        )
    (sweep_dir / "sweep.json").write_text(json.dumps(out, indent=2, default=str))
    return out


def _tuner(cfg: ExperimentConfig, trainable: Any, sweep_dir: Path, concurrent: int) -> Any:
    """The sweep's Tuner: restored from sweep_dir (tune.resume) or new, with its search, ASHA and concurrency."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    path, t = str(sweep_dir), cfg.tune
    if t.resume and tune.Tuner.can_restore(path):
        print(f"[yolo_ray] resuming sweep {path}", flush=True)
        return tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
    scheduler = None
    if t.scheduler == "asha":
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=cfg.train.epochs,
            grace_period=t.grace_period,
            reduction_factor=t.reduction_factor,
        )
    return tune.Tuner(
        trainable,
        param_space=to_tune_space(t.space),
        tune_config=tune.TuneConfig(
            metric=t.metric,
            mode=t.mode,
            num_samples=t.num_samples,
            search_alg=_search_alg(t),
            scheduler=scheduler,
            max_concurrent_trials=concurrent,
            time_budget_s=t.time_budget_s,
        ),
        run_config=tune.RunConfig(
            name=cfg.run.name,
            storage_path=str(sweep_dir.parent),
            failure_config=tune.FailureConfig(max_failures=cfg.run.max_failures),
        ),
    )


def _placement_groups_left(wait_s: float = 60.0) -> int:
    """Placement groups still holding resources once the sweep is over (Ray Train frees stopped trials' groups
    asynchronously, so give it a moment)."""
    import time

    import ray

    deadline = time.time() + wait_s
    while True:
        alive = [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]
        if not alive or time.time() > deadline:
            return len(alive)
        time.sleep(1)


def _search_alg(t: TuneSection) -> Any:
    if t.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(seed=t.seed)
    return None  # random sampling and grid_search: Tune's BasicVariantGenerator


def _parent_run(cfg: ExperimentConfig, uri: str, sweep_dir: Path) -> str:
    """The sweep's MLflow run (kept in sweep_dir/mlflow.json so a resumed sweep keeps it)."""
    from mlflow import MlflowClient

    from yolo_ray.tracking.mlflow_server import ensure_experiment
    from yolo_ray.tracking.run_record import flatten, log_params, run_tags

    state_file = sweep_dir / layout.MLFLOW_STATE
    if state_file.exists():
        return json.loads(state_file.read_text())["run_id"]
    client = MlflowClient(tracking_uri=uri)
    exp_id = ensure_experiment(client, cfg, uri)
    run = client.create_run(exp_id, run_name=cfg.run.name, tags={**run_tags(cfg), "yolo_ray.kind": "sweep"})
    tune_params = flatten({"tune": cfg.tune.__dict__ | {"trial": cfg.tune.trial.__dict__}})
    log_params(client, run.info.run_id, {**flatten(cfg.to_dict()), **tune_params})
    state_file.write_text(json.dumps({"tracking_uri": uri, "run_id": run.info.run_id}))
    return run.info.run_id

"""Ray Tune sweeps: every trial is a full yolo_ray training run (Train inside Tune), reported every epoch.

Where a sweep is defined: the `tune:` section of an experiment YAML (search space, metric, search algorithm,
scheduler, per-trial scaling). Each trial trains with `launcher.train` under a name equal to its trial id, so a
restarted trial resumes its own Ray Train checkpoint, and logs an MLflow child run under the sweep's parent run.
"""

from __future__ import annotations

import csv
import json
import math
import threading
from pathlib import Path
from typing import Any

import yaml

from yolo_ray import config as config_mod
from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError, ExperimentConfig, TuneSection
from yolo_ray.config_checks import ultralytics_train_keys, worker_range
from yolo_ray.metrics import sweepable
from yolo_ray.summary import read_history
from yolo_ray.tasks import SCORES, metric_key

KINDS = ("choice", "uniform", "loguniform", "grid")


# --------------------------------------------------------------------------------------------- the search space


def _key_exists(cfg: ExperimentConfig, dotted: str) -> bool:
    node: Any = cfg.to_dict()
    parts = dotted.split(".")
    if parts[:2] == ["train", "extra"] and len(parts) == 3:
        return parts[2] in ultralytics_train_keys()
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return not isinstance(node, dict)


def check_space(cfg: ExperimentConfig) -> None:
    """Every bad search space fails here, before Ray or any trial starts."""
    _check_tune_settings(cfg)
    for key, spec in cfg.tune.space.items():
        _check_dimension(cfg, key, spec)


def _check_tune_settings(cfg: ExperimentConfig) -> None:
    t, src = cfg.tune, cfg.source
    if not t.space:
        raise ConfigError(
            src,
            "tune.space",
            "is empty: nothing to sweep.",
            "add e.g. `train.lr0: {loguniform: [0.0001, 0.1]}` under tune.space.",
        )
    if t.num_samples < 1:
        raise ConfigError(src, "tune.num_samples", "must be >= 1.", "set tune.num_samples to 1 or more.")
    if not sweepable(t.metric):  # found only after the first trial trained, otherwise
        what = f"{t.metric!r} is not a metric every epoch reports."
        names = ", ".join(SCORES)
        raise ConfigError(src, "tune.metric", what, f"use a score ({names}), fitness, or a loss (train/box_loss).")
    t.metric = metric_key(t.metric)  # Ultralytics' `metrics/mAP50-95(M)` is history's `mask_mAP50-95`
    if t.scheduler == "asha" and t.reduction_factor < 2:
        raise ConfigError(
            src, "tune.reduction_factor", f"must be >= 2, got {t.reduction_factor}.", "ASHA keeps 1/factor: set 2 or 3."
        )
    if t.scheduler == "asha" and not 1 <= t.grace_period <= cfg.train.epochs:
        raise ConfigError(
            src,
            "tune.grace_period",
            f"{t.grace_period} is outside 1..train.epochs ({cfg.train.epochs}).",
            "set the epochs every trial runs before ASHA may stop it, e.g. 2.",
        )
    for key, value in (("tune.max_concurrent", t.max_concurrent), ("tune.reference_batch", t.reference_batch)):
        if value != "auto" and value < 1:
            raise ConfigError(src, key, f"must be >= 1, got {value}.", "set it to 1 or more.")
    if t.time_budget_s is not None and not t.time_budget_s > 0:
        raise ConfigError(src, "tune.time_budget_s", "must be > 0 seconds.", "set a positive budget, or null.")
    least, most = worker_range(t.trial.num_workers)  # a range is checked with the config
    if least < 1:
        raise ConfigError(src, "tune.trial.num_workers", "must be >= 1.", "set it to 1 or more.")
    if most > 1 and 0 < t.trial.gpus_per_worker < 1:
        raise ConfigError(
            src,
            "tune.trial.gpus_per_worker",
            "a fraction with several workers per trial puts two ranks on one GPU, which NCCL refuses.",
            "use whole GPUs, or tune.trial.num_workers: 1.",
        )
    if cfg.train.val_async:  # its actor would wait outside the trials' reserved resources, and training with it
        raise ConfigError(
            src,
            "train.val_async",
            "is not supported in sweeps: each trial's validation actor would need resources Tune has not reserved.",
            "set train.val_async: false for the sweep (trials validate inline).",
        )


def _check_dimension(cfg: ExperimentConfig, key: str, spec: Any) -> None:
    """One key of tune.space: a training key, a distribution of its kind, and every value it can take valid."""
    t, src = cfg.tune, cfg.source
    least, most = worker_range(t.trial.num_workers)
    where = f"tune.space.{key}"
    if not _key_exists(cfg, key) or key.startswith(("tune.", "run.", "tracking.", "scaling.")):
        raise ConfigError(
            src,
            where,
            f"`{key}` is not a training key that can be swept.",
            "use a dotted key such as train.lr0, train.batch, train.accumulate, train.extra.mosaic.",
        )
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise ConfigError(
            src,
            where,
            f"{spec!r} is not a distribution.",
            f"write one of {', '.join(f'{{{k}: ...}}' for k in KINDS)}.",
        )
    kind, values = next(iter(spec.items()))
    if kind in ("choice", "grid"):
        if not isinstance(values, list) or not values:
            raise ConfigError(src, where, f"{kind} needs a non-empty list of values.", f"e.g. {{{kind}: [8, 16]}}.")
        if kind == "grid" and t.search == "optuna":
            raise ConfigError(
                src,
                where,
                "grid values need the grid (or random) search.",
                "set tune.search: grid, or use {choice: [...]} with Optuna.",
            )
    else:
        if not (isinstance(values, list) and len(values) == 2 and all(isinstance(v, (int, float)) for v in values)):
            raise ConfigError(src, where, f"{kind} needs [low, high].", f"e.g. {{{kind}: [0.001, 0.1]}}.")
        low, high = values
        if low >= high:
            raise ConfigError(src, where, f"low {low} >= high {high}.", "give low < high.")
        if kind == "loguniform" and low <= 0:
            raise ConfigError(src, where, "loguniform needs low > 0.", "use a positive low bound.")
    for value in _candidates(kind, values):  # each sampled config must itself be valid
        sampled = config_mod.apply(cfg, {key: value})
        if key == "train.batch" and least == most and sampled.train.batch % most:  # elastic: batch_plan's rule
            raise ConfigError(
                src,
                where,
                f"batch {value} does not divide by tune.trial.num_workers={t.trial.num_workers}.",
                f"use batches that are multiples of {t.trial.num_workers}.",
            )


def _candidates(kind: str, values: list) -> list:
    return list(values) if kind in ("choice", "grid") else [values[0], values[1]]


def to_tune_space(space: dict[str, dict]) -> dict[str, Any]:
    from ray import tune

    make = {
        "choice": tune.choice,
        "grid": tune.grid_search,
        "uniform": lambda v: tune.uniform(*v),
        "loguniform": lambda v: tune.loguniform(*v),
    }
    return {key: make[kind](values) for key, spec in space.items() for kind, values in spec.items()}


def scaled_lr(t: TuneSection, lr0: float, batch: int, accumulate: int | None) -> float:
    """lr0 for an effective batch of batch * accumulate, scaled from reference_batch (none / linear / sqrt)."""
    ratio = batch * (accumulate or 1) / t.reference_batch
    return lr0 * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[t.lr_scaling]


def trial_config(base: ExperimentConfig, sampled: dict[str, Any], trial_id: str, sweep_dir: Path) -> ExperimentConfig:
    cfg = config_mod.apply(base, sampled)
    lr0 = scaled_lr(base.tune, cfg.train.lr0, cfg.train.batch, cfg.train.accumulate)
    tr = base.tune.trial
    return config_mod.apply(
        cfg,
        {
            "train.lr0": lr0,
            "scaling.num_workers": tr.num_workers,
            "scaling.cpus_per_worker": tr.cpus_per_worker,
            "scaling.gpus_per_worker": tr.gpus_per_worker,
            "run.name": trial_id,
            "run.storage_path": str(sweep_dir / "trials"),
            "tracking.enabled": False,  # the sweep driver logs every trial to MLflow (one writer)
            "tracking.register": False,
        },
    )


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
    import ray
    from ray import tune

    from yolo_ray import inputs
    from yolo_ray.driver import ray_cluster
    from yolo_ray.tracking import mlflow_server

    check_space(cfg)
    inputs.prepare(cfg)  # model and dataset checks (and synthetic generation) before any trial
    sweep_dir = layout.run_dir(cfg.run.storage_path, cfg.run.name)
    uri = mlflow_server.tracking_uri(cfg) if cfg.tracking.enabled else None
    if uri:
        mlflow_server.check(cfg, uri)
    ray_cluster.connect(cfg.run.ray_address, verbose=cfg.run.verbose)
    use_gpu = bool(cfg.scaling.use_gpu) if cfg.scaling.use_gpu != "auto" else ray.cluster_resources().get("GPU", 0) > 0
    cfg = resolve_trial_cpus(cfg, use_gpu, ray_cluster.alive_nodes())
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


# --------------------------------------------------------------------------------------------- results


def report(
    cfg: ExperimentConfig, base: ExperimentConfig, grid: Any, sweep_dir: Path, follower: TrialFollower | None
) -> dict[str, Any]:
    t = cfg.tune
    sign = 1 if t.mode == "max" else -1
    trials = []
    for result in grid:
        trial_id = (result.metrics or {}).get("trial_id") or Path(result.path or "?").name
        # The trial's own history is the record of what it trained (a stopped trial may finish one more epoch
        # after Tune's decision); Tune's dataframe is the fallback.
        history = read_history(sweep_dir / "trials" / trial_id)
        if not history and result.metrics_dataframe is not None:
            history = result.metrics_dataframe.to_dict("records")
        values = [h[t.metric] for h in history if t.metric in h and h[t.metric] == h[t.metric]]
        trials.append(
            {
                "trial_id": trial_id,
                "config": result.config,
                "epochs": max((int(h.get("epoch", 0)) for h in history), default=0),
                "best": max(values, key=lambda v: sign * v) if values else None,
                "status": "error"
                if result.error
                else ("completed" if history and history[-1].get("epoch", 0) >= cfg.train.epochs else "stopped early"),
                "history": [{k: h.get(k) for k in ("epoch", t.metric, "train/box_loss")} for h in history],
            }
        )
    scored = [tr for tr in trials if tr["best"] is not None]
    best = max(scored, key=lambda tr: sign * tr["best"]) if scored else None
    out = {"sweep_dir": str(sweep_dir), "metric": t.metric, "mode": t.mode, "trials": trials, "best": None}
    if best:
        best_cfg = trial_config(base, best["config"], f"{cfg.run.name}-best", sweep_dir)
        best_cfg = config_mod.apply(
            best_cfg,
            {
                "run.storage_path": cfg.run.storage_path,
                **{f"scaling.{k}": v for k, v in cfg.to_dict()["scaling"].items()},  # the full run's scaling
                "tracking.enabled": cfg.tracking.enabled,
                "tracking.register": cfg.tracking.register,
                "tune.space": {},
            },
        )
        best_yaml = sweep_dir / "best.yaml"
        best_yaml.write_text(
            "# Best trial of sweep " + cfg.run.name + f" ({t.metric} {best['best']:.4f}); "
            "train it with: yolo-ray train "
            + str(best_yaml)
            + "\n"
            + yaml.safe_dump(_without_tune(best_cfg.to_dict()), sort_keys=False)
        )
        weights = layout.weights(sweep_dir / "trials" / best["trial_id"]) / "best.pt"
        out["best"] = {**best, "config_yaml": str(best_yaml), "weights": str(weights) if weights.exists() else None}
    _write_table(sweep_dir, trials, t.metric)
    (sweep_dir / "sweep.json").write_text(json.dumps(out, indent=2, default=str))
    if follower:
        follower.finish(out)
    _print_table(trials, t.metric, out["best"])
    return out


def _without_tune(d: dict) -> dict:
    d = dict(d)
    d.pop("tune", None)
    return d


def _write_table(sweep_dir: Path, trials: list[dict], metric: str) -> None:
    keys = sorted({k for tr in trials for k in tr["config"]})
    with open(sweep_dir / "trials.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial_id", *keys, "epochs", f"best_{metric}", "status"])
        for tr in trials:
            w.writerow([tr["trial_id"], *(tr["config"].get(k) for k in keys), tr["epochs"], tr["best"], tr["status"]])


def _print_table(trials: list[dict], metric: str, best: dict | None) -> None:
    keys = sorted({k for tr in trials for k in tr["config"]})
    print(
        "\n"
        + "  ".join(
            ["trial".ljust(10), *(k.split(".")[-1][:10].ljust(10) for k in keys), "epochs", metric.ljust(10), "status"]
        )
    )
    for tr in trials:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in (tr["config"].get(k) for k in keys)]
        score = f"{tr['best']:.4f}" if tr["best"] is not None else "-"
        print(
            "  ".join(
                [
                    tr["trial_id"].ljust(10),
                    *(c.ljust(10) for c in cells),
                    str(tr["epochs"]).ljust(6),
                    score.ljust(10),
                    tr["status"],
                ]
            )
        )
    if best:
        print(
            f"\nbest: {best['trial_id']} {metric}={best['best']:.4f} -> {best['config_yaml']}\n"
            f"      weights: {best['weights']}",
            flush=True,
        )


class TrialFollower:
    """The sweep driver's MLflow writer: one child run per trial (nested under the sweep's run), fed from each
    trial's history.jsonl. Trials never write to MLflow themselves, so a local sqlite store sees one writer."""

    def __init__(self, uri: str, parent: str, sweep_dir: Path):
        self.uri, self.parent, self.sweep_dir = uri, parent, sweep_dir
        self.trackers: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="mlflow-trials")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(3.0):
            try:
                self.sync()
            except Exception as e:  # server away: trial histories keep everything for the next pass
                print(f"[yolo_ray] mlflow: trial sync deferred ({type(e).__name__}: {e})", flush=True)

    def tracker(self, trial_id: str) -> Any:
        from yolo_ray.driver import ray_cluster
        from yolo_ray.tracking import mlflow_runs as tracking

        if trial_id not in self.trackers:
            run_dir = self.sweep_dir / "trials" / trial_id
            cfg = config_mod.load(run_dir / layout.CONFIG)
            tracker = tracking.Tracker(cfg, run_dir, self.uri, parent_run_id=self.parent)
            sc = cfg.scaling
            scaling = ray_cluster.Scaling(
                sc.num_workers, bool(sc.use_gpu), sc.cpus_per_worker, sc.gpus_per_worker, sc.placement_strategy
            )
            tracker.start(scaling, nodes=1)
            self.trackers[trial_id] = tracker
        return self.trackers[trial_id]

    def sync(self) -> None:
        for config_yaml in sorted((self.sweep_dir / "trials").glob("*/config.yaml")):
            self.tracker(config_yaml.parent.name).sync_metrics()

    def finish(self, out: dict) -> None:
        """Close every trial's child run (early-stopped ones as KILLED), tag the best, give the parent its table
        and plots."""
        from mlflow import MlflowClient

        self.sync()
        client = MlflowClient(tracking_uri=self.uri)
        best_id = (out["best"] or {}).get("trial_id")
        for tr in out["trials"]:
            if not (self.sweep_dir / "trials" / tr["trial_id"] / layout.CONFIG).exists():
                continue
            tracker = self.tracker(tr["trial_id"])
            client.set_tag(tracker.state["run_id"], "yolo_ray.trial_status", tr["status"])
            client.set_tag(tracker.state["run_id"], "best_trial", str(tr["trial_id"] == best_id).lower())
            status = {"completed": "finished", "stopped early": "killed"}.get(tr["status"], "failed")
            tracker.finish(status, grace_s=30)
        for name in ("trials.csv", "sweep.json", "best.yaml"):
            if (self.sweep_dir / name).exists():
                client.log_artifact(self.parent, str(self.sweep_dir / name))
        for plot in _plots(out, self.sweep_dir):
            client.log_artifact(self.parent, str(plot), artifact_path="plots")
        if out["best"]:
            client.log_metric(self.parent, f"best_{out['metric']}", out["best"]["best"])
            client.set_tag(self.parent, "best_trial", best_id)
        client.set_terminated(self.parent, status="FINISHED")


def _safe(name: str) -> str:
    return name.replace("/", "_").replace(".", "_")


def _plots(out: dict, sweep_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, trials = out["metric"], out["trials"]
    paths = []
    keys = sorted({k for tr in trials for k in tr["config"]})
    for key in keys:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        pts = [(tr["config"][key], tr["best"]) for tr in trials if tr["best"] is not None and key in tr["config"]]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts])
        if key.endswith("lr0"):
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(f"best {metric}")
        ax.set_title(f"{metric} vs {key}")
        fig.tight_layout()
        paths.append(sweep_dir / f"{_safe(metric)}_vs_{_safe(key)}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for tr in trials:
        ax.plot(
            [h["epoch"] for h in tr["history"]], [h[metric] for h in tr["history"]], marker=".", label=tr["trial_id"]
        )
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title("learning curves of all trials")
    ax.legend(fontsize=6)
    fig.tight_layout()
    paths.append(sweep_dir / "learning_curves.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths

"""A sweep's results: the trials' table (CSV and printed), the best trial's config, plots of the metric against each
swept key, and the follower that logs each trial to MLflow as a child of the sweep's run while the sweep runs."""

from __future__ import annotations

import csv
import json
import threading
from pathlib import Path
from typing import Any

import yaml

from yolo_ray import config as config_mod
from yolo_ray import run_layout as layout
from yolo_ray.config import ExperimentConfig
from yolo_ray.driver.sweep_space import trial_config
from yolo_ray.summary import read_history


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

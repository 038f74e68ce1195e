"""The driver: check inputs, connect to Ray, run the TorchTrainer, write summary.json."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from yolo_ray import inputs, user_callbacks
from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError, ExperimentConfig
from yolo_ray.driver import run_lock
from yolo_ray.faults import FaultPlan
from yolo_ray.metrics import headline
from yolo_ray.progress import EpochConsole
from yolo_ray.summary import write_summary
from yolo_ray.worker_plan import BatchRule, StreamPlan, ValAsyncSettings, WorkerPlan


def train(cfg: ExperimentConfig, callbacks: list | None = None, parent_run_id: str | None = None) -> dict[str, Any]:
    """Run one experiment to the end (or resume it) and return its summary.

    callbacks: Ray Train callbacks (a Tune trial passes TuneReportCallback); parent_run_id nests the MLflow run.
    """
    started = time.time()
    checked = inputs.prepare(cfg)
    run_dir = inputs.check_storage(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_lock.hold(run_dir, cfg.source):  # before Ray: a second driver of this run fails here
        finished = _finished(cfg, run_dir)  # decided under the lock: a driver that waited sees the first one's end
        if finished is not None:
            return finished
        return _fit(cfg, checked, run_dir, started, callbacks, parent_run_id)


# What a finished run is: a re-run that differs here would not train what it asks for (the rest may change freely:
# where Ray, MLflow and storage are, how many workers, fault injection, sweeps).
RUN_DEFINING = ("model", "data", "train")


# What a stopped run may change when it resumes: yolo_ray's own settings (they are not in last.pt) and the few
# Ultralytics takes from the command line on resume (imgsz, batch, close_mosaic); it restores the rest from last.pt.
RESUMABLE_CHANGES = (
    "train.cuda_graphs", "train.val_cuda_graphs", "train.channels_last", "train.grad_clip", "train.sync_bn",
    "train.workers", "train.cache", "train.callbacks", "train.imgsz", "train.batch", "train.close_mosaic",
    "data.loader", "data.device_cache",
)  # fmt: skip


def _finished(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that already finished with these settings (None when it has not finished). A finished
    run re-run with other settings is refused, naming each key with its old and new value; so is a stopped run
    re-run with settings its resume would silently ignore (Ultralytics resumes with last.pt's own)."""
    done, saved = run_dir / layout.SUMMARY, run_dir / layout.CONFIG
    if not saved.exists():
        return None
    finished = done.exists() and json.loads(done.read_text()).get("status") == "finished"
    # keys a newer yolo_ray added are missing from an older run's config.yaml: they had their default then
    was = _with_defaults(ExperimentConfig().to_dict(), yaml.safe_load(saved.read_text()) or {})
    changed = changed_settings(was, cfg.to_dict())
    if not finished:
        if not _has_checkpoint(run_dir):  # stopped before its first epoch's checkpoint: nothing resumes, all may change
            return None
        ignored = {k: v for k, v in changed.items() if not k.startswith(RESUMABLE_CHANGES)}
        if ignored:
            what = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in ignored.items())
            raise ConfigError(
                cfg.source,
                ", ".join(ignored),
                f"run {cfg.run.name!r} stopped before its end and resumes with the settings it started with "
                f"(Ultralytics restores them from last.pt), not these ({what}).",
                "re-run without the changed keys to finish it, or choose a new run.name to train with them "
                "(Ultralytics cannot extend a started schedule: more epochs mean a new run).",
            )
        return None
    if changed:
        what = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ConfigError(
            cfg.source,
            ", ".join(changed),
            f"run {cfg.run.name!r} already finished ({done}) with other settings ({what}).",
            "choose a new run.name to train with these settings (the finished run stays as it is), or re-run "
            "without the changed keys.",
        )
    print(f"[yolo_ray] run {cfg.run.name} already finished: {done} (choose a new run.name to train again)")
    return json.loads(done.read_text())


def _has_checkpoint(run_dir: Path) -> bool:
    """Would a re-run resume (from a Ray Train checkpoint or Ultralytics' last.pt)?"""
    return (layout.weights(run_dir) / "last.pt").exists() or bool(layout.checkpoints(run_dir))


def _with_defaults(defaults: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for key, value in saved.items():
        both_sections = isinstance(value, dict) and isinstance(defaults.get(key), dict) and defaults.get(key)
        out[key] = _with_defaults(defaults[key], value) if both_sections else value
    return out


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old, new)} where two configs differ in the keys that define a run (RUN_DEFINING)."""

    def flat(d: Any, prefix: str) -> dict[str, Any]:
        if not isinstance(d, dict):
            return {prefix: d}
        return {k: v for key, value in d.items() for k, v in flat(value, f"{prefix}.{key}").items()}

    out: dict[str, tuple[Any, Any]] = {}
    for section in RUN_DEFINING:
        a, b = flat(old.get(section), section), flat(new.get(section), section)
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out[key] = (a.get(key), b.get(key))
    return out


def plan_workers(
    cfg: ExperimentConfig, checked: inputs.Inputs, data_yaml: Path, run_dir: Path, scaling: Any
) -> WorkerPlan:
    """Everything a Ray Train worker needs, decided once here (worker_plan.py)."""
    t, run, stream = cfg.train, cfg.run, checked.dataset.stream
    val_async = None
    if t.val_async:
        fail = None if run.fail_val_at_epoch is None else run.fail_val_at_epoch - 1
        val_async = ValAsyncSettings(t.val_runner, t.val_gpus, t.val_cpus, fail, cuda_graphs=t.val_cuda_graphs)
    return WorkerPlan(
        overrides=inputs.ultralytics_overrides(cfg, checked.model, data_yaml, run_dir / "train", checked.task),
        run_dir=str(run_dir),
        batch=BatchRule(t.batch, t.accumulate, scaling.num_workers),
        loader=cfg.data.loader,
        device_cache=cfg.data.device_cache,
        sync_bn=t.sync_bn,
        channels_last=t.channels_last,
        cuda_graphs=t.cuda_graphs,
        val_cuda_graphs=t.val_cuda_graphs,
        grad_clip=t.grad_clip,
        profile_steps=run.profile_steps,
        fault=FaultPlan(run.fail_at_epoch, run.fail_rank, run.fail_at_batch),
        val_async=val_async,
        stream=None if stream is None else _stream_plan(cfg, stream, scaling),
        export=cfg.tracking.enabled and cfg.tracking.register,
        callbacks=tuple(user_callbacks.parse(t.callbacks, cfg.source)),
        verbose=run.verbose,
    )


def _stream_plan(cfg: ExperimentConfig, stream: Any, scaling: Any) -> StreamPlan:
    """What a rank knows of the stream: the split's size, padded for the group, and who decodes with what."""
    d = cfg.data
    padded = stream.padded(scaling.num_workers)
    return StreamPlan(len(stream.images), padded, d.stream_buffer, d.stream_decoder(), int(scaling.cpus_per_worker))


def _stream_datasets(cfg: ExperimentConfig, plan: WorkerPlan, dataset: Any, workers: int) -> dict | None:
    """data.loader=stream: the Ray Dataset of the train split's files, split across the workers by Ray Train; built
    by Ray Train's controller at each worker-group start (stream_pipeline.AttemptPipeline), a worker's batch a task."""
    if dataset.stream is None:
        return None
    from yolo_ray.data import stream_pipeline

    on_cpu = cfg.data.stream_decoder() == "ray"  # auto: decided from the cluster (ray_cluster.with_stream_decode)
    data = stream_pipeline.AttemptPipeline(
        dataset.stream.rows(multiple=workers), dataset.stream.fs, cfg.train.imgsz, on_cpu, cfg.train.seed,
        plan.batch.per_worker(workers), plan.run_dir, cfg.run.verbose,
    )  # fmt: skip
    return {"train": data}


def _fit(
    cfg: ExperimentConfig,
    checked: inputs.Inputs,
    run_dir: Path,
    started: float,
    callbacks: list | None,
    parent_run_id: str | None,
) -> dict[str, Any]:
    """Connect to Ray, start MLflow, run the TorchTrainer, write summary.json (the run directory locked)."""
    from yolo_ray.driver import ray_cluster

    uri = None
    if cfg.tracking.enabled:
        # both imported before Ray connects: where a cluster's nodes share a filesystem (the tests' two-node
        # cluster), another node unpacking the job's working dir replaces these files while it does
        from yolo_ray.tracking import mlflow_server
        from yolo_ray.tracking.mlflow_runs import Tracker

        uri = mlflow_server.tracking_uri(cfg)
        mlflow_server.check(cfg, uri)
    data_yaml = checked.dataset.write(run_dir)  # what the workers read: every dataset path absolute
    where = ray_cluster.connect(cfg.run.ray_address, verbose=cfg.run.verbose)
    cfg = ray_cluster.with_stream_decode(cfg, ray_cluster.alive_nodes())
    scaling = ray_cluster.resolve(cfg)
    nodes = ray_cluster.node_count()
    (run_dir / layout.CONFIG).write_text(_yaml(cfg.to_dict()))
    tracker = None
    if uri is not None:
        mlflow_server.check_multinode(cfg, uri, nodes)
        tracker = Tracker(cfg, run_dir, uri, parent_run_id=parent_run_id)
        tracker.start(scaling, nodes, checked.dataset)
        tracker.follow()
    plan = plan_workers(cfg, checked, data_yaml, run_dir, scaling)
    print(
        f"[yolo_ray] ray: {where} | workers: {scaling.describe()} x {'GPU' if scaling.use_gpu else 'CPU'} | global "
        f"batch {cfg.train.batch} ({plan.batch.per_worker(scaling.num_workers)} per worker at {scaling.num_workers})"
        f" | run dir: {run_dir}",
        flush=True,
    )
    drop_torn_ray_snapshot(run_dir)
    datasets = _stream_datasets(cfg, plan, checked.dataset, scaling.num_workers)
    trainer = _torch_trainer(cfg, plan, scaling, callbacks, datasets)
    try:
        with EpochConsole(run_dir, cfg.train.epochs, started=started):
            result = trainer.fit()
    except Exception as e:
        write_summary(run_dir, cfg, scaling, started, status="failed", error=str(e))
        if tracker:
            tracker.stop_following()
            tracker.finish("failed")
        raise
    checkpoint = result.checkpoint.path if result.checkpoint else None
    summary = write_summary(run_dir, cfg, scaling, started, status="finished", checkpoint=checkpoint)
    _say_exported(run_dir, started)
    if tracker:
        tracker.stop_following()
        summary["mlflow"] = {"tracking_uri": uri, **tracker.finish("finished")}
        (run_dir / layout.SUMMARY).write_text(json.dumps(summary, indent=2))
    print(f"[yolo_ray] done: {headline(summary['final'])} | summary: {run_dir / layout.SUMMARY}", flush=True)
    return summary


CONTROLLER_POLL_ENV, CONTROLLER_POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5"


def _torch_trainer(
    cfg: ExperimentConfig, plan: WorkerPlan, scaling: Any, callbacks: list | None, datasets: dict | None
) -> Any:
    """Ray Train's TorchTrainer for the plan: the worker group's size and resources, storage, failure budgets."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from yolo_ray.data import stream_pipeline
    from yolo_ray.worker.loop import train_loop_per_worker

    resources = {"CPU": scaling.cpus_per_worker, **({"GPU": scaling.gpus_per_worker} if scaling.use_gpu else {})}
    run = cfg.run
    # Ray Train's controller looks at its workers every 2 s by default, and each step of a group's start waits for
    # the next look, as does the end of a run: 0.5 s makes those waits shorter for one cheap call per worker a poll.
    # Ray Train passes the variable on to the controller; a user's own value stands.
    os.environ.setdefault(CONTROLLER_POLL_ENV, CONTROLLER_POLL_S)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": plan},
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.ray_num_workers,
            elastic_resize_monitor_interval_s=cfg.scaling.elastic_resize_interval_s,
            use_gpu=scaling.use_gpu,
            resources_per_worker=resources,
            placement_strategy=scaling.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=run.name,
            storage_path=str(Path(plan.run_dir).parent),
            failure_config=ray.train.FailureConfig(
                max_failures=run.max_failures, max_preemption_failures=run.max_preemptions
            ),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=run.checkpoints_to_keep),
            callbacks=callbacks or None,
            logging_config=ray.LoggingConfig(log_level="INFO" if run.verbose else "WARNING"),
        ),
        torch_config=TorchConfig(backend="nccl" if scaling.use_gpu else "gloo"),
        datasets=datasets,
        dataset_config=stream_pipeline.ingest_config(ordered=cfg.train.deterministic) if datasets else None,
    )


RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of the run's registered checkpoints


def drop_torn_ray_snapshot(run_dir: Path) -> None:
    """A driver killed while Ray Train rewrote its checkpoint snapshot leaves it empty or cut short, and Ray's
    controller then refuses to start (CheckpointManagerInitializationError). The checkpoints themselves are intact
    and the workers find the newest by its meta.json (worker.resume_point), so a torn snapshot is removed."""
    snapshot = run_dir / RAY_SNAPSHOT
    try:
        json.loads(snapshot.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        print(f"[yolo_ray] {snapshot} is torn (a driver killed mid-write): removed; resuming from the checkpoints")
        snapshot.unlink(missing_ok=True)


def _say_exported(run_dir: Path, started: float) -> None:
    """Rank 0 exported best.pt and checked the ONNX model against PyTorch (export/check.json): say so."""
    check = layout.export(run_dir) / "check.json"
    if check.exists() and check.stat().st_mtime >= started:
        c = json.loads(check.read_text())
        print(
            f"[yolo_ray] exported {layout.weights(run_dir) / 'best.pt'} -> {check.parent / 'model.onnx'} "
            f"(onnxruntime vs PyTorch max |diff| {c['max_abs_diff']:.2e} of scale {c['output_scale']:.1f})",
            flush=True,
        )


def _yaml(d: dict) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)

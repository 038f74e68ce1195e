"""MLflow: one run per training run, per-epoch metrics, artifacts, and the ONNX model in the Model Registry.

The driver is the only MLflow writer. Workers never talk to MLflow: rank 0 appends each epoch to history.jsonl in
the run directory, and the driver ships new lines to MLflow from a background thread. So a tracking server that
goes down mid-run never slows or breaks training, and whatever it missed is sent once it is back (a cursor in
mlflow.json records what arrived). The run id lives in the run directory too, so a worker restart or a re-run of
the same command continues the same MLflow run.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from yolo_ray import gitinfo
from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError, ExperimentConfig
from yolo_ray.metrics import scores
from yolo_ray.summary import read_history
from yolo_ray.tasks import SCORES

STATE = layout.MLFLOW_STATE
# Fail fast against a server that is down; the sync loop retries on its own schedule.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
# Creating the run: a server slow under load (a read timeout) is no reason to lose the run before it trains.
START_ATTEMPTS, START_WAIT_S = 4, 5.0


def unanswered(e: BaseException) -> bool:
    """A request that timed out or found no server (MLflow wraps requests' errors), not the server saying no."""
    return isinstance(e, OSError) or "failed with timeout exception" in str(e) or "failed with exception" in str(e)


def tracking_uri(cfg: ExperimentConfig) -> str:
    """The experiment's tracking URI (see resolve_uri)."""
    return resolve_uri(cfg.tracking.uri, cfg.run.storage_path)


def resolve_uri(explicit: str | None, storage_path: str = "runs") -> str:
    """An explicit URI, else MLFLOW_TRACKING_URI, else the embedded sqlite store beside the runs
    (<storage_path>/mlflow.db: where `yolo-ray train` writes by default, so export/promote find it too)."""
    if explicit:
        return explicit
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    storage = Path(storage_path).expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{storage / 'mlflow.db'}"


def is_local(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file", "sqlite")


def check_reachable(cfg: ExperimentConfig, uri: str) -> None:
    """A remote tracking server must answer before any worker (or GPU) is started."""
    if is_local(uri):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as r:
            if r.status == 200:
                return
    except OSError as e:
        reason = str(e)
    else:
        reason = f"HTTP {r.status}"
    raise ConfigError(
        cfg.source,
        "tracking.uri",
        f"the MLflow tracking server {uri} does not answer ({reason}).",
        "start it (mlflow server ...), fix tracking.uri / MLFLOW_TRACKING_URI, or set tracking.enabled: false.",
    )


def check(cfg: ExperimentConfig, uri: str) -> None:
    """Before any worker starts: the server answers, and the registry will take the model's name and alias (MLflow
    refuses an alias shaped like a version, `v1`, or `latest`: found after training, the model would never get it)."""
    check_reachable(cfg, uri)
    if not cfg.tracking.register:
        return
    try:
        from mlflow.utils import validation
    except ImportError:
        return
    for key, value, rules in (
        ("tracking.alias", cfg.tracking.alias, ("_validate_model_alias_name", "_validate_model_alias_name_reserved")),
        ("tracking.model_name", cfg.tracking.model_name, ("_validate_model_name",)),
    ):
        for rule in (getattr(validation, r, None) for r in rules):
            if value is None or rule is None:
                continue
            try:
                rule(value)
            except Exception as e:  # MlflowException: the registry's own rule, as its server applies it
                raise ConfigError(
                    cfg.source, key, f"MLflow's registry refuses {value!r}: {e}", "choose another, e.g. candidate."
                ) from None


def check_multinode(cfg: ExperimentConfig, uri: str, nodes: int) -> None:
    if nodes > 1 and is_local(uri):
        raise ConfigError(
            cfg.source,
            "tracking.uri",
            f"{uri} is a local store, but this Ray cluster has {nodes} "
            "nodes: runs logged there are visible on one machine only.",
            "run an MLflow server every node can reach and set tracking.uri (or "
            "MLFLOW_TRACKING_URI) to its http:// address.",
        )


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _versions() -> dict[str, str]:
    import mlflow
    import ray
    import torch

    import yolo_ray

    try:
        from importlib.metadata import version

        ultralytics_version = version("ultralytics")
    except Exception:
        ultralytics_version = "unknown"
    return {
        "yolo_ray": yolo_ray.__version__,
        "ultralytics": ultralytics_version,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "mlflow": mlflow.__version__,
        "cuda": str(torch.version.cuda),
    }


def log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items()) if not k.startswith("tracking.tags")]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


def ensure_experiment(client: Any, cfg: ExperimentConfig, uri: str) -> str:
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        return exp.experiment_id
    artifacts = None
    if is_local(uri):  # keep artifacts beside the sqlite store, not in the working directory
        artifacts = (Path(cfg.run.storage_path).expanduser().resolve() / "mlartifacts").as_uri()
    return client.create_experiment(cfg.tracking.experiment, artifact_location=artifacts)


def run_tags(cfg: ExperimentConfig) -> dict[str, str]:
    """Versions, git commit and config source: the tags every yolo_ray run carries."""
    tags = {f"version.{k}": v for k, v in _versions().items()}
    commit = gitinfo.commit()  # the working directory: the user's project
    if commit:
        tags["mlflow.source.git.commit"] = commit
    tags["config"] = cfg.source
    tags.update({str(k): str(v) for k, v in cfg.tracking.tags.items()})
    return tags


# Keys that describe how a run was driven, not what it trained: left out of its MLflow params.
NOT_PARAMS = (
    "run.fail_at_epoch", "run.fail_rank", "run.fail_at_batch", "run.fail_val_at_epoch", "run.ray_address",
    "run.verbose", "tracking.tags", "tracking.outage_grace_s",
)  # fmt: skip


def run_params(cfg: ExperimentConfig, sweep_trial: bool) -> dict[str, Any]:
    """The config as MLflow params: what describes the run (tune.* only in a sweep's trials)."""
    params = flatten(cfg.to_dict())
    return {
        k: v for k, v in params.items() if not k.startswith(NOT_PARAMS) and (sweep_trial or not k.startswith("tune."))
    }


def context_tags(cfg: ExperimentConfig) -> dict[str, str]:
    """MLflow's own context tags, shown on the run page: who ran it and from what."""
    import getpass
    import sys

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return {
        "mlflow.user": user,
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": " ".join(["yolo-ray", *sys.argv[1:2], cfg.source])[:500],
    }


def describe(cfg: ExperimentConfig, workers: int | None) -> str:
    data = cfg.data.path if cfg.data.path != "synthetic" else f"generated {cfg.data.synthetic.style} ({cfg.data.dir})"
    who = f"{workers} workers x {cfg.train.batch // workers} images" if workers else f"global batch {cfg.train.batch}"
    return f"{cfg.model} on {data}, {who}, {cfg.train.epochs} epochs at {cfg.train.imgsz} px."


@contextlib.contextmanager
def _quiet(verbose: bool) -> Iterator[None]:
    """MLflow's own words while logging a model (its "Successfully registered" / "Created version" on stderr, and
    a warning that this machine's onnxruntime has no GPU provider): yolo_ray says what was registered itself."""
    if verbose:
        yield
        return
    logger = logging.getLogger("mlflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


# history.jsonl's keys as the MLflow run shows them, grouped as Ultralytics' results.csv groups them (metrics/,
# train/, val/, lr/) with timings under time/; MLflow sorts keys, so a group reads together in the UI.
METRIC_NAMES = {
    **{k: f"metrics/{k}" for k in SCORES},  # every task's: mAP50-95, mask_mAP50-95, pose_mAP50-95, top1, ...
    "epoch_time_s": "time/epoch_s",  # Ultralytics' epoch_time: training and the end of the epoch
    "train_time_s": "time/train_s",  # the batch loop
    "val_s": "time/val_s",
    "save_s": "time/epoch_end_s",  # Ultralytics' end of epoch: validation, results.csv, the checkpoint snapshot
    "report_s": "time/report_s",
    "persist_s": "time/persist_s",
    "checkpoint_write_s": "time/checkpoint_write_s",
    "images_per_s": "speed/images_per_s",
    "gpu_mem_peak_gib": "system/gpu_mem_peak_gib",
}
# Not metrics: the step itself, Ultralytics' fitness (its mAP50-95 for detection)
NOT_METRICS = ("epoch", "fitness", "time")
# The group's size and its split of the batch: params of a fixed group, metrics of an elastic one (it resizes)
GROUP = ("world_size", "per_worker_batch", "images_per_step")


def mlflow_metrics(row: dict[str, Any], elastic: bool = False) -> dict[str, float]:
    """One history.jsonl row as MLflow metrics: grouped names, and nothing that only restates the run (a first
    attempt's resumed_from_epoch -1, a CPU run's GPU memory 0, a fixed group's size)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key in NOT_METRICS:
            continue
        if key in GROUP:
            if elastic:
                out[f"system/{key}"] = float(value)
            continue
        if (key == "resumed_from_epoch" and value < 0) or (key == "gpu_mem_peak_gib" and not value):
            continue
        if key.startswith("val_ms_per_image/"):
            key = "time/" + key
        out[METRIC_NAMES.get(key, key)] = float(value)
    return out


def dataset_inputs(dataset: Any) -> list[Any]:
    """The run's dataset as MLflow dataset inputs, one per split (the run page's Datasets column): name, Ultralytics'
    hash of the split's files as digest, where it is, and what the checks counted as its profile."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    out = []
    for split, context in (("train", "training"), ("val", "validation")):
        s = dataset.splits[split]
        profile = {
            "images": len(s.images),
            "labelled_images": s.labelled,
            "boxes": s.boxes,
            "unusable_images": len(s.unusable),
            "classes": len(dataset.names),
        }
        entity = Dataset(
            name=dataset.name,
            digest=dataset.digest(split)[:16],
            source_type="local",
            source=json.dumps({"data_yaml": str(dataset.source), "split": split}),
            profile=json.dumps(profile),
        )
        out.append(DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return out


class Tracker:
    """The driver's MLflow writer for one run directory."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, uri: str, parent_run_id: str | None = None):
        from mlflow import MlflowClient

        self.cfg, self.run_dir, self.uri, self.parent_run_id = cfg, run_dir, uri, parent_run_id
        if not cfg.run.verbose:  # MLflow's INFO lines (database set-up, ...) stay out of the user's terminal
            logging.getLogger("mlflow").setLevel(logging.WARNING)
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # its "View run" on each end
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        self.state_file = run_dir / STATE
        self.state: dict[str, Any] = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self.workers: int | None = None  # set by start(); a later `yolo-ray sync` describes the run without it

    # ---------------------------------------------------------------- run lifecycle

    def start(self, scaling: Any, nodes: int, dataset: Any = None) -> str:
        """Create the MLflow run (or reuse the one this run directory already has), with its dataset as inputs.
        A request left unanswered is tried again, START_WAIT_S apart; a run an unanswered attempt did create is
        found by its run_dir tag, not created twice."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start(scaling, nodes, dataset, again=attempt > 1)
            except Exception as e:
                if attempt == START_ATTEMPTS or not unanswered(e):
                    raise
                print(f"[yolo_ray] mlflow: {self.uri} did not answer ({type(e).__name__}); trying again", flush=True)
                time.sleep(START_WAIT_S)
        raise AssertionError("unreachable")

    def _start(self, scaling: Any, nodes: int, dataset: Any, again: bool) -> str:
        if self.state.get("run_id"):  # a re-run of the same run directory: same MLflow run, running again
            self.client.update_run(self.state["run_id"], status="RUNNING")
            self.state["artifacts_logged"] = False
            self._save()
            print(f"[yolo_ray] mlflow: continuing run {self.state['run_id']} at {self.uri}", flush=True)
            return self.state["run_id"]
        exp_id = ensure_experiment(self.client, self.cfg, self.uri)
        tags = {**run_tags(self.cfg), "run_dir": str(self.run_dir), **context_tags(self.cfg)}
        self.workers = scaling.num_workers
        tags["mlflow.note.content"] = describe(self.cfg, self.workers)
        if self.parent_run_id:  # a sweep trial: nested under the sweep's run in the UI
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = (self._created_unanswered(exp_id) if again else None) or self.client.create_run(
            exp_id, run_name=self.cfg.run.name, tags=tags
        )
        self.state = {"tracking_uri": self.uri, "run_id": run.info.run_id, "experiment_id": exp_id, "synced": 0}
        self._save()
        params = run_params(self.cfg, sweep_trial=self.parent_run_id is not None)
        params.update(
            {
                "scaling.num_workers": scaling.describe(),  # `auto` resolved; an elastic group's range
                "tracking.model_name": self.model_name,
                "scaling.world_size": scaling.num_workers,
                "scaling.nodes": nodes,
                "scaling.use_gpu": scaling.use_gpu,
                "scaling.gpus_per_node": scaling.gpus_per_worker * scaling.num_workers / max(nodes, 1),
                "scaling.cpus_reserved_per_worker": scaling.cpus_per_worker,  # `auto` resolved
                "train.per_worker_batch": self.cfg.train.batch // scaling.num_workers,
                "train.effective_batch": self.cfg.train.batch * (self.cfg.train.accumulate or 1),
            }
        )
        self._log_params(run.info.run_id, params)
        if dataset is not None:
            self.client.log_inputs(run.info.run_id, datasets=dataset_inputs(dataset))
        print(
            f"[yolo_ray] mlflow: run {run.info.run_id} in experiment '{self.cfg.tracking.experiment}' at {self.uri}",
            flush=True,
        )
        return run.info.run_id

    def _created_unanswered(self, exp_id: str) -> Any:
        """The run an earlier, unanswered create_run made for this run directory, if the server made it."""
        found = self.client.search_runs([exp_id], filter_string=f"tags.run_dir = '{self.run_dir}'", max_results=1)
        return found[0] if found else None

    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        log_params(self.client, run_id, params)

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        tmp.replace(self.state_file)

    # ---------------------------------------------------------------- metrics

    def sync_metrics(self) -> int:
        """Send history lines MLflow has not seen yet (one point per metric per epoch). Returns how many."""
        from mlflow.entities import Metric

        history = read_history(self.run_dir)
        sent = 0
        for row in history[self.state.get("synced", 0) :]:
            ts = int(row.get("time", time.time()) * 1000)
            elastic = isinstance(self.cfg.scaling.num_workers, list)
            metrics = [Metric(k, v, ts, int(row["epoch"])) for k, v in mlflow_metrics(row, elastic).items()]
            self.client.log_batch(self.state["run_id"], metrics=metrics)
            self.state["synced"] = self.state.get("synced", 0) + 1
            self._save()
            sent += 1
        return sent

    def _loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.sync_metrics()
                if self._warned:
                    print("[yolo_ray] mlflow: tracking server is back; metrics caught up", flush=True)
                    self._warned = False
            except Exception as e:  # server down: training goes on, the cursor keeps what is pending
                if not self._warned:
                    print(
                        f"[yolo_ray] mlflow: cannot reach {self.uri} ({type(e).__name__}); training goes on, "
                        "metrics are kept in history.jsonl and sent when it is back",
                        flush=True,
                    )
                    self._warned = True

    def follow(self, every_s: float = 2.0) -> None:
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True, name="mlflow-sync")
        self._thread.start()

    def stop_following(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    # ---------------------------------------------------------------- the end of a run

    def finish(self, status: str, grace_s: float | None = None) -> dict[str, Any]:
        """Metrics, artifacts and the registered model, retried while the server is away (up to grace_s)."""
        grace_s = self.cfg.tracking.outage_grace_s if grace_s is None else grace_s
        deadline = time.time() + grace_s
        while True:
            try:
                return self._finish_once(status)
            except Exception as e:
                if _refused(e):  # the server answered no (4xx): waiting will not change its answer
                    why = f"{self.uri} refused a request ({' '.join(str(e).split())}); the run's results are kept"
                    return self._pending(e, f"{why}: fix what it names, then run `yolo-ray sync {self.run_dir}`")
                if time.time() > deadline:
                    why = f"could not finish logging ({e}); nothing is lost"
                    return self._pending(e, f"{why}: run `yolo-ray sync {self.run_dir}` once {self.uri} is back")
                time.sleep(3)

    def _pending(self, error: Exception, message: str) -> dict[str, Any]:
        """What MLflow has not got yet stays recorded for `yolo-ray sync`."""
        self.state["pending"] = True
        self._save()
        print(f"[yolo_ray] mlflow: {message}", flush=True)
        return {"pending": True, "error": str(error)}

    def _finish_once(self, status: str) -> dict[str, Any]:
        self.sync_metrics()
        run_id = self.state["run_id"]
        self._log_final(run_id)
        if not self.state.get("artifacts_logged"):
            self._log_artifacts(run_id)
            self.state["artifacts_logged"] = True
            self._save()
        out: dict[str, Any] = {"run_id": run_id}
        if status == "finished" and self.cfg.tracking.register and not self.state.get("registered"):
            self._register(run_id)
        if self.state.get("model_version"):
            out["model"] = {
                "name": self.model_name,
                "version": self.state["model_version"],
                "alias": self.cfg.tracking.alias,
            }
        self.client.set_terminated(run_id, status={"finished": "FINISHED", "killed": "KILLED"}.get(status, "FAILED"))
        self.state.pop("pending", None)
        self._save()
        return out

    def _log_final(self, run_id: str) -> None:
        """The final evaluation of best.pt as run metrics (final/mAP50-95, ...: what the registered model is tagged
        with), and in the run's description."""
        from mlflow.entities import Metric

        path = self.run_dir / layout.FINAL_METRICS
        if not path.exists():
            return
        final = json.loads(path.read_text())
        now, step = int(time.time() * 1000), self.cfg.train.epochs
        metrics = [Metric(f"final/{k}", float(v), now, step) for k, v in scores(final).items()]
        if metrics:
            self.client.log_batch(run_id, metrics=metrics)
            note = (
                describe(self.cfg, self.workers)
                + " Final (best.pt): "
                + ", ".join(f"{m.key.split('/', 1)[1]} {m.value:.4f}" for m in metrics)
            )
            self.client.set_tag(run_id, "mlflow.note.content", note)

    def _log_artifacts(self, run_id: str) -> None:
        train_dir = self.run_dir / "train"
        for f in sorted(train_dir.glob("*")):
            if f.is_file() and f.suffix in (".csv", ".png", ".jpg", ".yaml"):
                self.client.log_artifact(run_id, str(f), artifact_path="results")
        for name in ("best.pt", "last.pt"):
            if (train_dir / "weights" / name).exists():
                self.client.log_artifact(run_id, str(train_dir / "weights" / name), artifact_path="weights")
        for name in (layout.CONFIG, layout.SUMMARY, layout.HISTORY, layout.FINAL_METRICS):
            if (self.run_dir / name).exists():
                self.client.log_artifact(run_id, str(self.run_dir / name))
        if (layout.export(self.run_dir) / "check.json").exists():
            self.client.log_artifact(run_id, str(layout.export(self.run_dir) / "check.json"), artifact_path="export")

    @property
    def model_name(self) -> str:
        return self.cfg.tracking.model_name or f"yolo_ray-{self.cfg.run.name}"

    def _register(self, run_id: str) -> None:
        """One model version per run, whatever retries and syncs do: the version this run already has (in
        mlflow.json, or found in the registry by its run id) gets the tags and alias; only a run without one logs
        export/model.onnx as an MLflow ONNX model and registers it."""
        version = self.state.get("model_version") or self._version_of(run_id)
        if version is None:
            version = self._log_model(run_id)
            if version is None:
                return
        self.state["model_version"] = version  # saved before the tags and alias: a retry reuses it
        self._save()
        final = json.loads((self.run_dir / layout.FINAL_METRICS).read_text())
        tags = {
            **{k: _round(v) for k, v in scores(final).items()},  # the task's scores (promote compares `headline`)
            "task": final.get("task", "detect"),
            "headline": final.get("headline", "mAP50-95"),
            "run_id": run_id,
            "data": self.cfg.data.path if self.cfg.data.path != "synthetic" else f"synthetic:{self.cfg.data.dir}",
            "imgsz": self.cfg.train.imgsz,
            "names": json.dumps(final.get("names", {})),
        }
        for k, v in tags.items():
            self.client.set_model_version_tag(self.model_name, version, k, str(v))
        self.client.set_registered_model_alias(self.model_name, self.cfg.tracking.alias, version)
        self.state["registered"] = True
        self._save()
        print(
            f"[yolo_ray] mlflow: registered models:/{self.model_name}@{self.cfg.tracking.alias} (version {version})",
            flush=True,
        )

    def _version_of(self, run_id: str) -> str | None:
        """The version of this model that this run registered, if any (a registration cut off before mlflow.json
        recorded it)."""
        with contextlib.suppress(Exception):  # no such registered model yet
            versions = self.client.search_model_versions(f"run_id = '{run_id}'")
            mine = sorted((v for v in versions if v.name == self.model_name), key=lambda v: int(v.version))
            if mine:
                return str(mine[0].version)
        return None

    def _log_model(self, run_id: str) -> str | None:
        """export/model.onnx as an MLflow ONNX model (one file, a signature, an input example), registered."""
        import mlflow
        import numpy as np
        import onnx
        import onnxruntime as ort
        from mlflow.models import infer_signature

        onnx_path = layout.export(self.run_dir) / "model.onnx"
        if not onnx_path.exists():
            print("[yolo_ray] mlflow: no export/model.onnx; nothing to register", flush=True)
            return None
        imgsz = self.cfg.train.imgsz
        example = np.zeros((1, 3, imgsz, imgsz), np.float32)
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        output = session.run(None, {session.get_inputs()[0].name: example})[0]
        mlflow.set_tracking_uri(self.uri)
        mlflow.set_registry_uri(self.uri)
        with _quiet(self.cfg.run.verbose), mlflow.start_run(run_id=run_id):  # quiet: its closing "View run" too
            info = mlflow.onnx.log_model(
                onnx.load(str(onnx_path)),
                name=self.cfg.run.name,
                save_as_external_data=False,  # one model.onnx that loads alone when downloaded from the UI
                signature=infer_signature(example, output),
                input_example=example,
                registered_model_name=self.model_name,
            )
        return str(info.registered_model_version)


def _refused(e: Exception) -> bool:
    """A request the tracking server (or MLflow's client, checking it first) refused, rather than could not answer:
    a 4xx status, e.g. an invalid alias."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:
        return False
    return isinstance(e, MlflowException) and 400 <= e.get_http_status_code() < 500

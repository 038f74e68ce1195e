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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from yolo_ray import run_layout as layout
from yolo_ray.config import ExperimentConfig
from yolo_ray.metrics import scores
from yolo_ray.summary import read_history
from yolo_ray.tracking.mlflow_server import ensure_experiment, unanswered
from yolo_ray.tracking.run_record import (
    context_tags,
    dataset_inputs,
    describe,
    log_params,
    mlflow_metrics,
    run_params,
    run_tags,
)

STATE = layout.MLFLOW_STATE
# Creating the run: a server slow under load (a read timeout) is no reason to lose the run before it trains.
START_ATTEMPTS, START_WAIT_S = 4, 5.0


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

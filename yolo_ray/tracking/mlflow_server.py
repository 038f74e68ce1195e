"""The MLflow tracking server, before a run: which URI (explicit, MLFLOW_TRACKING_URI, or the embedded sqlite store
beside the runs), whether it answers, whether the registry will take the model's name and alias, and the
experiment. Each check raises ConfigError (exit 2) before any worker or GPU is started."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from yolo_ray.config import ConfigError, ExperimentConfig

# Fail fast against a server that is down (MLflow reads these when it first talks to one); the tracker's sync loop
# retries on its own schedule.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


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


def ensure_experiment(client: Any, cfg: ExperimentConfig, uri: str) -> str:
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        return exp.experiment_id
    artifacts = None
    if is_local(uri):  # keep artifacts beside the sqlite store, not in the working directory
        artifacts = (Path(cfg.run.storage_path).expanduser().resolve() / "mlartifacts").as_uri()
    return client.create_experiment(cfg.tracking.experiment, artifact_location=artifacts)

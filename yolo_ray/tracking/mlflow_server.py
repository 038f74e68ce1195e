"""The MLflow tracking server, before a run: which URI (explicit, MLFLOW_TRACKING_URI, or the embedded sqlite store
beside the runs), whether it answers, whether the registry will take the model's name and alias, and the
experiment. Each check raises ConfigError (exit 2) before any worker or GPU is started."""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Callable
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


def reserved_alias(alias: str) -> None:
    """The registry's reserved aliases, as MLflow documents them: `latest` and version-shaped names (v1, V2, ...)."""
    if alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
        raise ValueError(f"alias {alias!r} is reserved: MLflow keeps `latest` and version-shaped names (v1, V2, ...).")


Rule = Callable[[str], None]
# MLflow's registry rules, by every name they have had, and what stands in where none is found (they are private:
# 3.18 renamed `_validate_model_alias_name*` to `_validate_alias_name*`, and a lookup that found neither had silently
# dropped the check).
Rules = tuple[tuple[tuple[str, ...], Rule | None], ...]
_ALIAS_RULES: Rules = (
    (("_validate_alias_name", "_validate_model_alias_name"), None),
    (("_validate_alias_name_reserved", "_validate_model_alias_name_reserved"), reserved_alias),
)
_NAME_RULES: Rules = ((("_validate_model_name",), None),)


def registry_rules(validation: Any, rules: Rules) -> list[Rule]:
    """Each rule under the first of its names that `validation` has, else its stand-in."""
    found = (next((getattr(validation, n) for n in names if hasattr(validation, n)), alt) for names, alt in rules)
    return [rule for rule in found if rule is not None]


def check(cfg: ExperimentConfig, uri: str) -> None:
    """Before any worker starts: the server answers, and the registry will take the model's name and alias (MLflow
    refuses an alias shaped like a version, `v1`, or `latest`: found after training, the model would never get it)."""
    check_reachable(cfg, uri)
    if not cfg.tracking.register:
        return
    from mlflow.utils import validation

    for key, value, rules in (
        ("tracking.alias", cfg.tracking.alias, _ALIAS_RULES),
        ("tracking.model_name", cfg.tracking.model_name, _NAME_RULES),
    ):
        if value is None:
            continue
        for rule in registry_rules(validation, rules):
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

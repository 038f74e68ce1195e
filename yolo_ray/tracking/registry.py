"""MLflow Model Registry operations: find weights for a source, promote a version to `champion`."""

from __future__ import annotations

from pathlib import Path

from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError

CHAMPION = "champion"


class PromotionRefused(RuntimeError):
    """The candidate is worse than the current champion (and force was not given)."""


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def resolve_weights(source: str, uri: str, download_to: Path) -> Path:
    """A local .pt for: a .pt file, a run directory, a Ray checkpoint dir, an MLflow run id, or models:/name@alias."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".pt":
        return path.resolve()
    if path.is_dir():
        for candidate in (layout.weights(path) / "best.pt", path / "last.pt", path / "weights" / "best.pt"):
            if candidate.is_file():
                return candidate.resolve()
        raise ConfigError(
            "yolo-ray export",
            "SOURCE",
            f"{path} holds no best.pt or last.pt.",
            "pass a run directory, a checkpoint directory, a .pt, a run id or models:/name@alias.",
        )
    client = _client(uri)
    run_id = source
    if source.startswith("models:/"):
        run_id = _model_version(client, source).run_id
    try:
        local = client.download_artifacts(run_id, "weights/best.pt", str(download_to))
    except Exception as e:
        raise ConfigError(
            "yolo-ray export",
            "SOURCE",
            f"cannot fetch weights/best.pt for {source!r} from {uri} ({e}).",
            "check the run id / model URI and --tracking-uri (or MLFLOW_TRACKING_URI).",
        ) from None
    return Path(local)


def _model_version(client, model_uri: str):
    """models:/name@alias or models:/name/version -> ModelVersion."""
    rest = model_uri[len("models:/") :]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return client.get_model_version_by_alias(name, alias)
    name, version = rest.rsplit("/", 1)
    return client.get_model_version(name, version)


def _score(version) -> float:
    """The version's headline score (its task's: mAP50-95, mask_mAP50-95, pose_mAP50-95 or top1)."""
    return float(version.tags.get(_headline(version), "nan"))


def _headline(version) -> str:
    return version.tags.get("headline", "mAP50-95")


def promote(name: str, version: str, uri: str, force: bool = False) -> str:
    """Point `champion` at name/version unless its headline score is worse than the current champion's."""
    client = _client(uri)
    candidate = client.get_model_version(name, version)
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except Exception:
        current = None
    if current is not None and current.version != candidate.version and not force:
        if not _score(candidate) >= _score(current):
            raise PromotionRefused(
                f"{name} v{candidate.version} ({_headline(candidate)} {_score(candidate):.4f}) is worse than the "
                f"champion v{current.version} ({_score(current):.4f}); the champion stays. Use --force to promote "
                "anyway."
            )
    client.set_registered_model_alias(name, CHAMPION, candidate.version)
    was = f" (was v{current.version})" if current is not None else ""
    return f"models:/{name}@{CHAMPION} -> v{candidate.version}{was}"

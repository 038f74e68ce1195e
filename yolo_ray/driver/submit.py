"""`yolo-ray submit`: a Ray Jobs SDK wrapper that submits a train (or tune) run to a cluster and follows it."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
import urllib.request
from pathlib import Path

from yolo_ray.config import ConfigError, ExperimentConfig

# the job's environment: the tracking server, fault injection, and how long Ray Train waits for a full group before
# trying a smaller elastic one (60 s by default: the wait after a preemption)
FORWARDED_ENV = ("MLFLOW_TRACKING_URI", "YOLO_RAY_FAIL_AT", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S")


def cluster_nodes(address: str) -> int | None:
    """Alive nodes, from the dashboard's state API (None if it cannot tell)."""
    try:
        with urllib.request.urlopen(f"{address.rstrip('/')}/api/v0/nodes?limit=1000", timeout=10) as r:
            nodes = json.loads(r.read())["data"]["result"]["result"]
        return sum(1 for n in nodes if n.get("state") == "ALIVE")
    except Exception:
        return None


def preflight(cfg: ExperimentConfig, nodes: int | None) -> list[str]:
    """What a multi-node run needs and this config lacks (paths must be shared, MLflow reachable by all)."""
    if not nodes or nodes < 2:
        return []
    missing = []
    if not Path(cfg.run.storage_path).is_absolute():
        missing.append(
            f"run.storage_path ({cfg.run.storage_path!r}) is relative: on {nodes} nodes it must be an "
            "absolute path on storage every node mounts (e.g. /mnt/shared/runs)"
        )
    if cfg.data.path != "synthetic" and not Path(cfg.data.path).is_absolute():
        missing.append(f"data.path ({cfg.data.path!r}) is relative: use a data.yaml on shared storage")
    if cfg.data.path == "synthetic" and not Path(cfg.data.dir).is_absolute():
        missing.append(f"data.dir ({cfg.data.dir!r}) is relative: generate the dataset onto shared storage")
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if cfg.tracking.enabled and (not uri or not uri.startswith(("http://", "https://", "databricks"))):
        missing.append("tracking.uri (or MLFLOW_TRACKING_URI) must be an MLflow server every node can reach")
    return missing


def entrypoint(command: str, config_path: str | None, overrides: list[str]) -> str:
    args = ["yolo-ray", command, *([config_path] if config_path else []), *overrides]
    return " ".join(shlex.quote(a) for a in args)


def submit(
    address: str,
    command: str,
    cfg: ExperimentConfig,
    config_path: str | None,
    overrides: list[str],
    wait: bool = True,
    working_dir: str = ".",
) -> int:
    from ray.job_submission import JobStatus, JobSubmissionClient

    missing = preflight(cfg, cluster_nodes(address))
    if missing:
        raise ConfigError(
            cfg.source,
            "cluster",
            "this cluster has several nodes and the run is not ready for it: " + "; ".join(missing) + ".",
            "fix the keys named above (see cluster/README.md).",
        )
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    client = JobSubmissionClient(address)
    job_id = client.submit_job(
        entrypoint=entrypoint(command, config_path, overrides),
        runtime_env={"working_dir": working_dir, "env_vars": {"YOLO_OFFLINE": "1", **env}},
        metadata={"yolo_ray.run": cfg.run.name, "yolo_ray.config": cfg.source},
    )
    print(job_id if not wait else f"[yolo_ray] submitted {job_id} to {address}", flush=True)
    if not wait:
        return 0

    async def follow() -> None:
        async for lines in client.tail_job_logs(job_id):
            sys.stdout.write(lines)
            sys.stdout.flush()

    asyncio.run(follow())
    status = client.get_job_status(job_id)
    while not status.is_terminal():
        time.sleep(1)
        status = client.get_job_status(job_id)
    print(f"[yolo_ray] job {job_id}: {status.value}", flush=True)
    return 0 if status == JobStatus.SUCCEEDED else 1

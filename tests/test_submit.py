"""`ray job submit` and `yolo-ray submit` against a real 2-node cluster (head + network-namespace node)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import HEAD_IP, NODE_ENV, RAY, REPO, MlflowServer, small_run, yolo_ray
from mlflow import MlflowClient

JOBS = f"http://{HEAD_IP}:8265"


def _on_both_nodes(shapes_small: Path, storage: Path, name: str, *extra: str) -> list[str]:
    # Both "nodes" see this machine's filesystem, which stands in for the shared volume of a real cluster.
    return small_run(shapes_small, storage, name, "train.epochs=2", "scaling.placement_strategy=STRICT_SPREAD", *extra)


def test_ray_job_submit_trains_on_both_nodes(
    two_node_cluster: str, shapes_small: Path, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    overrides = [
        *_on_both_nodes(shapes_small, tmp_path, "job"),
        "tracking.enabled=true",
        f"tracking.uri={mlflow_server.uri}",
        "tracking.register=false",
    ]
    proc = subprocess.run(
        [
            RAY,
            "job",
            "submit",
            "--address",
            JOBS,
            "--working-dir",
            str(REPO),
            "--",
            "yolo-ray",
            "train",
            "experiments/smoke.yaml",
            *overrides,
        ],
        env=NODE_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert "succeeded" in proc.stdout and proc.returncode == 0, proc.stdout[-5000:]
    attached = [ln for ln in proc.stdout.splitlines() if ln.startswith("[yolo_ray] ray: ")]
    assert len(attached) == 1 and "ray: local" not in attached[0]  # attached to the cluster; never a private Ray
    assert "[yolo_ray] epoch 2/2" in proc.stdout  # the job's logs stream the training progress
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "job" / "ranks").glob("rank*.json"))]
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["nodes"] == 2
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    runs = [
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id])
        if r.info.run_name == "job"
    ]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["scaling.nodes"] == "2"


def test_bad_config_job_fails_with_the_clear_error(two_node_cluster: str, shapes_small: Path, tmp_path: Path) -> None:
    overrides = [
        *_on_both_nodes(shapes_small, tmp_path, "bad"),
        "scaling.num_workers=3",
        "train.batch=18",
    ]  # 3 workers STRICT_SPREAD on 2 nodes: never placeable
    proc = yolo_ray(
        "submit",
        "experiments/smoke.yaml",
        *overrides,
        "--address",
        JOBS,
        "--working-dir",
        str(REPO),
        cwd=REPO,
        env=NODE_ENV,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "FAILED" in proc.stdout and "scaling.num_workers" in proc.stdout and "Fix:" in proc.stdout
    assert "Traceback" not in proc.stdout


def test_submit_preflight_names_what_multinode_needs(two_node_cluster: str, tmp_path: Path) -> None:
    proc = yolo_ray("submit", "experiments/smoke.yaml", "--address", JOBS, "--no-wait", cwd=REPO, env=NODE_ENV)
    assert proc.returncode == 2, proc.stdout[-3000:]
    for what in ("run.storage_path", "data.dir", "tracking.uri"):
        assert what in proc.stdout.replace("\n  ", " ")

"""Multi-node: a real 2-node Ray cluster made of two Linux network namespaces, one training worker per node."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import HEAD_IP, NODE_IP, small_run, yolo_ray


def test_two_nodes_train_together(two_node_cluster: str, shapes_small: Path, tmp_path: Path) -> None:
    # A tracking store on one machine's disk is refused for a multi-node cluster, before training starts.
    local_store = yolo_ray(
        "train",
        *small_run(shapes_small, tmp_path, "multinode", "tracking.enabled=true", f"run.ray_address={two_node_cluster}"),
        cwd=tmp_path,
    )
    assert local_store.returncode == 2 and "is a local store" in local_store.stdout
    proc = yolo_ray(
        "train",
        *small_run(
            shapes_small,
            tmp_path,
            "multinode",
            "train.epochs=3",
            f"run.ray_address={two_node_cluster}",
            "scaling.placement_strategy=STRICT_SPREAD",
        ),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-5000:]
    run_dir = tmp_path / "multinode"
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank*.json"))]
    assert [r["world_rank"] for r in ranks] == [0, 1]
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    assert [r["env"]["NODE_RANK"] for r in ranks] == [str(r["node_rank"]) for r in ranks]
    assert [r["local_rank"] for r in ranks] == [0, 0]
    assert {r["node_ip"] for r in ranks} == {HEAD_IP, NODE_IP}
    assert ranks[0]["param_sha256"] == ranks[1]["param_sha256"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["nodes"] == 2 and summary["epochs_completed"] == 3

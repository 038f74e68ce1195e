"""Multi-node: a real 2-node Ray cluster made of two Linux network namespaces, one training worker per node; one node
is lost mid-run and replaced, and the run resumes from its last epoch checkpoint. The stream loader reads and decodes
on the node that trains nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import (
    ENV,
    HEAD_IP,
    NODE_IP,
    REPO,
    check_resumed,
    kill_node,
    read_jsonl,
    small_run,
    start_node,
    yolo_ray,
)

from yolo_ray import config
from yolo_ray.data import stream_loader
from yolo_ray.driver import ray_cluster, sweep, sweep_space
from yolo_ray.driver.ray_cluster import auto_cpus_per_worker

EPOCHS = 4
SMALL_TRAIN_IMAGES = 96  # shapes_small's train split


def test_two_nodes_train_together_and_survive_losing_one(
    two_node_cluster: str, shapes_small: Path, tmp_path: Path
) -> None:
    # A tracking store on one machine's disk is refused for a multi-node cluster, before training starts.
    local_store = yolo_ray(
        "train",
        *small_run(shapes_small, tmp_path, "multinode", "tracking.enabled=true", f"run.ray_address={two_node_cluster}"),
        cwd=tmp_path,
    )
    assert local_store.returncode == 2 and "is a local store" in " ".join(local_store.stdout.split())
    args = small_run(
        shapes_small,
        tmp_path,
        "multinode",
        f"train.epochs={EPOCHS}",
        f"run.ray_address={two_node_cluster}",
        "scaling.placement_strategy=STRICT_SPREAD",  # one rank per node: losing a node loses a rank
        "run.max_failures=1",
        "train.accumulate=2",  # explicit accumulation survives the restart too
    )
    run_dir = tmp_path / "multinode"
    history = run_dir / "history.jsonl"
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "yolo_ray", "train", *args], cwd=tmp_path, env=ENV, stdout=log, stderr=log
        )
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None:
            if history.exists() and read_jsonl(history):
                break
            time.sleep(0.5)
        assert driver.poll() is None, "the run ended before a node could be lost"
        assert kill_node() > 0  # the second machine dies mid-epoch: its raylet and rank 1 with it
        killed_at = max(h["epoch"] for h in read_jsonl(history))
        start_node()  # a replacement machine joins (as KubeRay or the autoscaler would bring one)
        driver.wait(timeout=600)
    out = (tmp_path / "driver.log").read_text()
    assert driver.returncode == 0, out[-5000:]
    rows = read_jsonl(history)
    assert [h["epoch"] for h in rows] == list(range(1, EPOCHS + 1))  # no epoch lost, none trained twice
    resumed = [h for h in rows if h["resumed_from_epoch"] >= 0]
    assert resumed, "no epoch came from a restarted worker group"
    resumed_from = resumed[0]["resumed_from_epoch"]
    assert resumed_from in (killed_at, killed_at + 1)  # the newest checkpoint on storage
    assert f"resuming from the epoch-{resumed_from} checkpoint" in out
    check_resumed(run_dir, resumed_from, EPOCHS)  # weights, LR schedule, final metrics
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank*.json"))]
    assert [r["world_rank"] for r in ranks] == [0, 1]
    assert [(r["per_worker_batch"], r["accumulate"]) for r in ranks] == [(8, 2), (8, 2)]
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    assert [r["env"]["NODE_RANK"] for r in ranks] == [str(r["node_rank"]) for r in ranks]
    assert [r["local_rank"] for r in ranks] == [0, 0]
    assert {r["node_ip"] for r in ranks} == {HEAD_IP, NODE_IP}
    assert ranks[0]["param_sha256"] == ranks[1]["param_sha256"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["nodes"] == 2 and summary["restarts"] == 1


def test_the_stream_reads_and_decodes_on_a_node_that_trains_nothing(
    two_node_cluster: str, shapes_small: Path, tmp_path: Path
) -> None:
    """A CPU-only node's share of a stream run: the one worker holds every CPU of its node, so Ray Data's reading and
    OpenCV decoding (stream_decode cpu) can only run on the other node, and its blocks cross to the worker's."""
    from ray.util.state import list_nodes, list_tasks

    run = yolo_ray(
        "train",
        *small_run(shapes_small, tmp_path, "stream2n", "train.epochs=2", f"run.ray_address={two_node_cluster}"),
        "data.loader=stream",
        "data.stream_decode=cpu",
        "scaling.num_workers=1",
        "scaling.cpus_per_worker=1",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-5000:]
    run_dir = tmp_path / "stream2n"
    assert [h["epoch"] for h in read_jsonl(run_dir / "history.jsonl")] == [1, 2]
    (rank,) = [json.loads(p.read_text()) for p in (run_dir / "ranks").glob("rank*.json")]
    dashboard = f"http://{HEAD_IP}:8265"
    ips = {n.node_id: n.node_ip for n in list_nodes(address=dashboard)}
    reads = [t for t in list_tasks(address=dashboard, detail=True, limit=10_000) if "read_rows" in t.name]
    assert reads, "no Ray Data task read the images"
    assert {ips[t.node_id] for t in reads} == {HEAD_IP, NODE_IP} - {rank["node_ip"]}
    for epoch in (0, 1):  # every image once an epoch, carried across from the other node
        ids = [i for r in stream_loader.read_records(run_dir) if r["epoch"] == epoch for i in r["ids"]]
        assert sorted(ids) == list(range(SMALL_TRAIN_IMAGES)), epoch


def _node(cpus: float, gpus: float = 0) -> dict:
    """A node as ray.nodes() describes it (only what the sizing reads)."""
    return {"Alive": True, "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}


def test_auto_stream_decode_follows_the_cluster() -> None:
    """data.stream_decode auto: the Train workers' processes decode where every node that can has a GPU (a head's
    few CPUs aside); Ray Data's tasks where nodes without GPUs can take the decoding, and when training on CPUs. The
    decision sizes the workers' CPUs (all of a GPU's share but 2 for Ray Data's reading)."""
    stream = config.load(None, ["data.loader=stream"])  # the embedded default: scaling.use_gpu auto
    assert stream.data.stream_decode == "auto" and stream.scaling.use_gpu == "auto"

    def decode(nodes: list[dict], **over: object) -> str:
        return ray_cluster.with_stream_decode(config.apply(stream, over), nodes).data.stream_decode

    assert decode([_node(16, 1)]) == "worker"
    assert decode([_node(4), _node(32, 4)]) == "worker"  # a head node's CPUs
    assert decode([_node(4), _node(32, 4), _node(16)]) == "cpu"  # a CPU node to decode on
    assert decode([_node(2)]) == "cpu"  # no GPU: trains on CPUs
    assert decode([_node(16, 1)], **{"scaling.use_gpu": False}) == "cpu"
    assert decode([_node(16, 1)], **{"data.stream_decode": "device"}) == "device"  # chosen: kept
    decided = ray_cluster.with_stream_decode(stream, [_node(16, 1)])
    assert auto_cpus_per_worker(decided, True, [_node(16, 1)]) == 13


def test_auto_cpus_per_worker() -> None:
    """A GPU worker reserves its loader processes and the training process (whose torch threads Ray sets to it),
    within its GPU's share of the smallest GPU node; CPU workers keep 1."""
    cfg = config.load(REPO / "experiments" / "throughput-h200.yaml", ["train.workers=8"])
    assert config.load(REPO / "experiments" / "throughput-h200.yaml", []).scaling.cpus_per_worker == "auto"
    assert auto_cpus_per_worker(cfg, True, [_node(16, 1)]) == 9  # 8 loader processes + the training process
    assert auto_cpus_per_worker(cfg, True, [_node(8), _node(32, 4), _node(64, 4)]) == 7  # (32 - 1) // 4; CPU head
    assert auto_cpus_per_worker(cfg, True, [_node(4, 4)]) == 1
    assert auto_cpus_per_worker(cfg, True, []) == 9  # an autoscaling cluster with no GPU node yet
    assert auto_cpus_per_worker(cfg, False, [_node(2)]) == 1
    # tune trials: a 0.25-GPU trial worker gets a quarter of its GPU's share; trials without a GPU get 1
    assert auto_cpus_per_worker(cfg, True, [_node(16, 1)], gpus_per_worker=0.25) == 3  # (16 - 1) * 0.25
    assert auto_cpus_per_worker(cfg, True, [_node(16, 1)], gpus_per_worker=0) == 1
    assert auto_cpus_per_worker(cfg, True, [_node(8, 4)], gpus_per_worker=2) == 3  # two GPUs' share: (8 - 1) * 2 // 4
    # the stream: 2 (the training process's threads); decoding in the worker: its GPU's share less 2 for Ray Data
    stream = config.apply(cfg, {"data.loader": "stream"})
    assert auto_cpus_per_worker(stream, True, [_node(16, 1)]) == 2
    worker = config.apply(stream, {"data.stream_decode": "worker"})
    assert auto_cpus_per_worker(worker, True, [_node(16, 1)]) == 13  # 15 - 2
    assert auto_cpus_per_worker(worker, True, [_node(8), _node(32, 4), _node(64, 4)]) == 5  # (32 - 1) // 4 - 2
    assert auto_cpus_per_worker(worker, True, [_node(4, 4)]) == 1
    assert auto_cpus_per_worker(worker, False, [_node(2)]) == 0.5
    assert cfg.tune.trial.cpus_per_worker == "auto"
    resolved = sweep.resolve_trial_cpus(config.apply(cfg, {"tune.trial.gpus_per_worker": 0.5}), True, [_node(16, 1)])
    assert resolved.tune.trial.cpus_per_worker == 7  # what every trial reserves and max_concurrent divides by
    assert sweep_space.trial_config(resolved, {}, "t0", REPO).scaling.cpus_per_worker == 7
    assert sweep.resolve_trial_cpus(cfg, False, [_node(2)]).tune.trial.cpus_per_worker == 1

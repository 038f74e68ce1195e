"""Elastic training and preemption on a real 2-node Ray cluster (two Linux network namespaces, 1 CPU each):
`scaling.num_workers: [1, 2]` shrinks when a node is lost and grows when one joins, and a preempted (drained) node costs
the epoch in flight, counted against the preemption budget, not run.max_failures. Each epoch's line records the
group's size and its split of the global batch; the images per optimizer step stay the same at every size."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    ENV,
    HEAD_IP,
    NODE_IP,
    PORT,
    RAY,
    _sh,
    _teardown,
    kill_node,
    read_jsonl,
    small_run,
    start_head,
    start_node,
)

from yolo_ray import batch_plan

START_TIMEOUT_S = 15
# A drained node trains on until its deadline (~3 epochs), and then some: the preempted run must still be training
# when the node goes, 8 s after the notice (a CI machine once trained shapes_small at 0.8 s an epoch and finished 10
# epochs at the deadline)
PREEMPT_EPOCHS = 20


@pytest.fixture
def head_only() -> Iterator[str]:
    """A head node alone (1 CPU: one worker fits); the test brings the second node when it wants."""
    try:
        # Ray Train waits this long for a group of the largest size before it tries a smaller one (60 s by
        # default): after a preemption it first asks for both workers, the drained node's included
        start_head(RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=str(START_TIMEOUT_S))
        yield f"{HEAD_IP}:{PORT}"
    finally:
        _teardown()


def _elastic_run(data: Path, tmp_path: Path, address: str, name: str, epochs: int, *extra: str
                 ) -> tuple[list[str], Path]:  # fmt: skip
    args = small_run(
        data,
        tmp_path,
        name,
        f"train.epochs={epochs}",
        f"run.ray_address={address}",
        "scaling.num_workers=[1,2]",
        "scaling.elastic_resize_interval_s=2",
        *extra,
    )
    return args, tmp_path / name


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    log = open(tmp_path / "driver.log", "w")
    return subprocess.Popen([sys.executable, "-m", "yolo_ray", "train", *args], cwd=tmp_path, env=ENV, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip


def _wait_epochs(history: Path, n: int, driver: subprocess.Popen, timeout: float = 600) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = read_jsonl(history) if history.exists() else []
        if len(rows) >= n:
            return max(r["epoch"] for r in rows)
        assert driver.poll() is None, "the run ended early"
        time.sleep(0.3)
    raise TimeoutError(history)


def _finished(driver: subprocess.Popen, tmp_path: Path, run_dir: Path, epochs: int) -> list[dict]:
    try:
        driver.wait(timeout=900)
    finally:
        if driver.poll() is None:
            driver.kill()
    out = (tmp_path / "driver.log").read_text()
    assert driver.returncode == 0, out[-5000:]
    rows = read_jsonl(run_dir / "history.jsonl")
    assert [r["epoch"] for r in rows] == list(range(1, epochs + 1)), rows  # every epoch once
    assert {r["images_per_step"] for r in rows} == {16}  # the global batch at every size
    assert all(r["per_worker_batch"] <= 8 for r in rows)  # never more a worker than at full size (2 x 8)
    return rows


ELASTIC_EPOCHS = 10  # on the 384-image shapes set: mAP50 0.4-0.6 by epoch 10 (0.73 at 14)


def test_the_group_shrinks_when_a_node_is_lost_and_grows_when_one_joins(
    head_only: str, shapes: Path, tmp_path: Path
) -> None:
    """Started on two nodes, the run loses one after epoch 2 (no replacement: it goes on with the head's worker from
    its newest checkpoint), then a node joins (an autoscaler's node, a spot node coming back) and the group restarts
    on two from the newest checkpoint: every epoch once, the same images per optimizer step, one model, mAP rising."""
    start_node()
    args, run_dir = _elastic_run(shapes, tmp_path, head_only, "elastic", ELASTIC_EPOCHS, "run.max_failures=2")
    args = [a for a in args if not a.startswith(("data.synthetic", "train.imgsz"))]  # the shapes set's own spec
    driver = _start(args, tmp_path)
    history = run_dir / "history.jsonl"
    killed_at = _wait_epochs(history, 2, driver)
    assert kill_node() > 0
    while not [r for r in read_jsonl(history) if r["world_size"] == 1]:  # the group goes on with the head's worker
        assert driver.poll() is None, "the run ended early"
        time.sleep(0.3)
    start_node()
    rows = _finished(driver, tmp_path, run_dir, ELASTIC_EPOCHS)
    sizes = [r["world_size"] for r in rows]
    assert 1 in sizes and 2 in sizes[sizes.index(1) :], sizes  # it shrank, then grew
    shrunk = sizes.index(1)
    grown = shrunk + sizes[shrunk:].index(2)
    assert set(sizes[:shrunk]) == {2} and set(sizes[shrunk:grown]) == {1} and set(sizes[grown:]) == {2}, sizes
    assert rows[shrunk]["resumed_from_epoch"] in (killed_at, killed_at + 1)  # nothing lost before the last checkpoint
    assert rows[grown]["resumed_from_epoch"] == rows[grown]["epoch"] - 1  # restarted from the newest checkpoint
    assert [(r["per_worker_batch"], r["world_size"]) for r in (rows[shrunk], rows[-1])] == [(8, 1), (8, 2)]
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank*.json"))]
    assert len(ranks) == 2 and ranks[0]["param_sha256"] == ranks[1]["param_sha256"]  # one model on both nodes
    assert max(r["mAP50"] for r in rows[-3:]) > max(r["mAP50"] for r in rows[:3]) + 0.2, [r["mAP50"] for r in rows]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_sizes"] == sizes and summary["status"] == "finished"


def test_a_preempted_node_costs_the_epoch_in_flight_not_a_failure(
    head_only: str, shapes_small: Path, tmp_path: Path
) -> None:
    """`ray drain-node` with the preemption reason and a deadline, then the node goes after it (a spot reclaim):
    Ray Train stops the group at the deadline and restarts it on what is left (the head's worker) from the newest
    epoch checkpoint; with run.max_failures=0 the run still goes on (the preemption budget is another). Lost: the
    epoch in flight (the time from that checkpoint to the deadline, reported)."""
    start_node()
    args, run_dir = _elastic_run(shapes_small, tmp_path, head_only, "preempt", PREEMPT_EPOCHS, "run.max_failures=0")
    driver = _start(args, tmp_path)
    history = run_dir / "history.jsonl"
    _wait_epochs(history, 2, driver)
    deadline_s = 5
    drained = time.time()
    drain = _sh(RAY, "drain-node", f"--address={head_only}", f"--node-id={_node_id(NODE_IP)}",
                "--reason=DRAIN_NODE_REASON_PREEMPTION", "--reason-message=spot reclaim",
                f"--deadline-remaining-seconds={deadline_s}", check=False, env=ENV)  # fmt: skip
    assert drain.returncode == 0, drain.stdout
    time.sleep(deadline_s)  # Ray Train stops the group at the deadline, counting a preemption
    killed = time.time()
    time.sleep(3)
    assert driver.poll() is None, "the run finished before the node went: raise PREEMPT_EPOCHS"
    assert kill_node() > 0  # the cloud takes the node (its processes, not Ray's teardown, end it here)
    saved = read_jsonl(history)
    rows = _finished(driver, tmp_path, run_dir, PREEMPT_EPOCHS)
    resumed = next(r for r in rows if r["resumed_from_epoch"] >= 0)
    assert resumed["resumed_from_epoch"] >= saved[-1]["epoch"]  # no checkpoint lost
    assert rows[-1]["world_size"] == 1
    saved_at = next(r["time"] for r in rows if r["epoch"] == resumed["resumed_from_epoch"])
    lost_s = killed - saved_at
    epoch_s = [b["time"] - a["time"] for a, b in zip(rows, rows[1:], strict=False) if b["world_size"] == 2]
    print(
        f"preempted: notice at {drained:.1f}, last checkpoint (epoch {resumed['resumed_from_epoch']}) "
        f"{saved_at - drained:+.1f} s from it, node gone {killed - drained:.1f} s after it, first epoch of the "
        f"resumed group done {resumed['time'] - killed:.1f} s after that; lost {lost_s:.1f} s of training "
        f"(epochs here ~{min(epoch_s or [0]):.1f} s)"
    )
    assert lost_s < 60  # at most the epoch in flight (plus the deadline) on this machine


def test_the_split_keeps_the_images_per_step() -> None:
    """batch_plan's rule: never more images a worker than at full size, accumulation making up the rest."""
    full = batch_plan.plan(64, 1, 4, 4)
    assert (full.per_worker, full.accumulate, full.per_step) == (16, 1, 64)
    assert [(p.per_worker, p.accumulate, p.per_step) for p in (batch_plan.plan(64, 1, w, 4) for w in (1, 2, 3))] == [
        (16, 4, 64),
        (16, 2, 64),
        (10, 2, 60),  # 64 does not divide by 3: the nearest count at or below
    ]
    assert batch_plan.plan(16, 3, 2, 2).ultralytics() == {"batch": 16, "nbs": 48}  # fixed: as before


def _node_id(ip: str) -> str:
    with urllib.request.urlopen(f"http://{HEAD_IP}:8265/api/v0/nodes", timeout=10) as r:
        nodes = json.loads(r.read())["data"]["result"]["result"]
    return next(n["node_id"] for n in nodes if n["node_ip"] == ip and n["state"] == "ALIVE")

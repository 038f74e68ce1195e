"""Multi-node: a real 2-node Ray cluster made of two Linux network namespaces, one training worker per node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ENV, small_run, yolo_ray

NS, HEAD_IF, NODE_IF = "yolo_ray_n1", "yr-veth0", "yr-veth1"
HEAD_IP, NODE_IP, PORT = "10.213.0.1", "10.213.0.2", 6391


def _sh(*cmd: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _teardown() -> None:
    ray = shutil.which("ray", path=os.path.dirname(os.sys.executable)) or "ray"
    _sh(ray, "stop", "--force", check=False, env=ENV)
    _sh("ip", "netns", "del", NS, check=False)
    _sh("ip", "link", "del", HEAD_IF, check=False)


@pytest.fixture
def two_node_cluster(tmp_path: Path) -> Iterator[str]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.fail("the multi-node test needs root and iproute2 (.ci/run installs iproute2)")
    ray = str(Path(os.sys.executable).parent / "ray")
    _teardown()
    try:
        _sh("ip", "netns", "add", NS)
        _sh("ip", "link", "add", HEAD_IF, "type", "veth", "peer", "name", NODE_IF)
        _sh("ip", "link", "set", NODE_IF, "netns", NS)
        _sh("ip", "addr", "add", f"{HEAD_IP}/24", "dev", HEAD_IF)
        _sh("ip", "link", "set", HEAD_IF, "up")
        _sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{NODE_IP}/24", "dev", NODE_IF)
        _sh("ip", "netns", "exec", NS, "ip", "link", "set", NODE_IF, "up")
        _sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
        # gloo binds the interface named here; without it, it picks 127.0.0.1 and the peer's connect is refused.
        _sh(
            ray,
            "start",
            "--head",
            f"--node-ip-address={HEAD_IP}",
            f"--port={PORT}",
            "--num-cpus=1",
            "--include-dashboard=false",
            "--disable-usage-stats",
            env={**ENV, "GLOO_SOCKET_IFNAME": HEAD_IF},
        )
        _sh(
            "ip",
            "netns",
            "exec",
            NS,
            ray,
            "start",
            f"--address={HEAD_IP}:{PORT}",
            f"--node-ip-address={NODE_IP}",
            "--num-cpus=1",
            "--disable-usage-stats",
            env={**ENV, "GLOO_SOCKET_IFNAME": NODE_IF},
        )
        time.sleep(2)
        yield f"{HEAD_IP}:{PORT}"
    finally:
        _teardown()


def test_two_nodes_train_together(two_node_cluster: str, shapes_small: Path, tmp_path: Path) -> None:
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

"""Shared fixtures: generated datasets, a CLI runner, and the 2-worker training run several tests inspect."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from yolo_ray.data.synth import SynthSpec, generate
from yolo_ray.summary import read_jsonl  # the tests' reader of history.jsonl and friends, as the package reads them
from yolo_ray.worker.checkpoint_writer import STAGING_PREFIX  # an epoch checkpoint's staging directory

REPO = Path(__file__).resolve().parents[1]

# Real Ray and real Ultralytics, kept offline and quiet; token auth off for local test clusters.
ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "YOLO_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}  # (Ray Train's controller polls its workers every 0.5 s: the driver's default, launcher.CONTROLLER_POLL_S)
ENV.pop("RAY_ADDRESS", None)


def yolo_ray(*args: str, cwd: Path, timeout: float = 1200, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m yolo_ray ARGS` as a user would; the combined output is kept next to the run for debugging."""
    proc = subprocess.run(
        [sys.executable, "-m", "yolo_ray", *args],
        cwd=cwd,
        env=env or ENV,
        timeout=timeout,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    (Path(cwd) / f"cli-{abs(hash(args)) % 10**8}.log").write_text(proc.stdout)
    return proc


def kill_tree(pid: int) -> None:
    """SIGKILL a driver and every process it started (its local Ray: raylet, workers), as when its machine dies.

    Killing only the driver's process group is not that: Ray's workers sit in their own groups and train on for a
    few seconds until the raylet notices."""
    import psutil

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def check_resumed(run_dir: Path, resumed_from: int, epochs: int) -> list[dict]:
    """A finished run that failed once and resumed from the epoch-`resumed_from` checkpoint: every epoch once, the
    second attempt starting from exactly the saved weights and at the right point of the LR schedule."""
    history = read_jsonl(run_dir / "history.jsonl")
    assert sorted({h["epoch"] for h in history}) == list(range(1, epochs + 1))
    first_attempt = [h for h in history if h["resumed_from_epoch"] == -1]
    second_attempt = [h for h in history if h["resumed_from_epoch"] == resumed_from]
    assert first_attempt and second_attempt and len(first_attempt) + len(second_attempt) == len(history)
    # The second attempt starts right after the checkpoint it resumed from, not at epoch 1.
    assert second_attempt[0]["epoch"] == resumed_from + 1
    # Resumed weights, not a fresh model: the second attempt starts from exactly what epoch k saved.
    saved = next(h for h in first_attempt if h["epoch"] == resumed_from)["saved_weights_sha256"]
    assert second_attempt[0]["start_weights_sha256"] == saved
    assert first_attempt[0]["start_weights_sha256"] != saved
    # The LR schedule resumed at the right epoch too (warmup is 1 epoch, then linear decay to lrf).
    for h in history[1:]:
        assert h["lr/pg0"] == pytest.approx(0.01 * ((1 - (h["epoch"] - 1) / epochs) * 0.99 + 0.01), rel=1e-6)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["epochs_completed"] == epochs
    assert all(math.isfinite(summary["final"][k]) and 0 <= summary["final"][k] <= 1 for k in ("mAP50", "mAP50-95"))
    return history


@pytest.fixture(scope="session")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The learnable dataset: 384 train / 76 val images of 3 shapes at 128 px."""
    out = tmp_path_factory.mktemp("shapes")
    generate(out, SynthSpec(images=384, imgsz=128, classes=3, seed=0))
    return out


@pytest.fixture(scope="session")
def shapes_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small set for runs that check mechanics (recovery, multi-node), not learning."""
    out = tmp_path_factory.mktemp("shapes_small")
    generate(out, SynthSpec(images=96, imgsz=64, classes=3, seed=1))
    return out


def small_data(shapes_small: Path) -> list[str]:
    """Overrides that point an experiment at the small dataset (and train at its size)."""
    return [
        f"data.dir={shapes_small}",
        "data.synthetic.images=96",
        "data.synthetic.imgsz=64",
        "data.synthetic.seed=1",
        "train.imgsz=64",
    ]


def small_run(shapes_small: Path, storage: Path, name: str, *extra: str) -> list[str]:
    """Overrides for a quick 2-worker CPU run on the small dataset."""
    return [
        *small_data(shapes_small),
        "train.batch=16",
        "train.accumulate=1",
        "train.plots=false",
        "train.close_mosaic=0",
        "train.warmup_epochs=1",
        "tracking.enabled=false",  # MLflow has its own tests
        f"run.storage_path={storage}",
        f"run.name={name}",
        *extra,
    ]


def ultralytics_train_dataset(root: Path, imgsz: int, **hyp: float):
    """(args, dataset): Ultralytics' training dataset for root/data.yaml, with its own augmentation pipeline."""
    from yolo_ray import ultralytics_env

    ultralytics_env.setup()
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    args = get_cfg(overrides={"imgsz": imgsz, "cache": False, **hyp})
    data = check_det_dataset(str(root / "data.yaml"))
    return args, build_yolo_dataset(args, data["train"], 16, data, mode="train", stride=32)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free ports: all n sockets are held open together, since a port freed by one call is often the
    very port the kernel hands the next (CI once gave Ray's agent and metrics ports the same number, and `ray start`
    failed)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


class SharedRay:
    """One local Ray for the runs that neither kill their Ray nor need a worker environment of their own: each
    attaches to it (RAY_ADDRESS, as a run under `ray job submit` does) instead of starting and stopping a private Ray
    (~8 s a run on 2 cores). Its processes know its address (RAY_ADDRESS in their environment), so Ray's state API
    in them never finds another Ray on the host. The 2-node tests' `ray stop --force` stops it too: `env()` starts
    it again when it is gone."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def env(self, **extra: str) -> dict[str, str]:
        """ENV for a CLI run on this Ray (started if it is not running)."""
        if not self.alive():
            self.start()
        return {**ENV, "RAY_ADDRESS": self.address, **extra}

    def start(self) -> None:
        """Start the head; a port taken between choosing and binding gets a second try on fresh ports (a restart
        after the 2-node tests reuses the head port chosen at session start)."""
        for attempt in (1, 2):
            agent, metrics = free_ports(2)
            proc = subprocess.run(
                [RAY, "start", "--head", f"--port={self.port}", "--node-ip-address=127.0.0.1",
                 "--include-dashboard=true", "--dashboard-host=127.0.0.1", "--dashboard-port=0",
                 f"--dashboard-agent-listen-port={agent}", f"--metrics-export-port={metrics}",
                 "--disable-usage-stats"],
                env={**ENV, "RAY_ADDRESS": self.address}, capture_output=True, text=True,
            )  # fmt: skip
            if proc.returncode == 0:
                return
            subprocess.run([RAY, "stop", "--force"], env=ENV, capture_output=True)  # what a failed start left
            if attempt == 1:
                self.port = free_port()
                self.address = f"127.0.0.1:{self.port}"
        raise RuntimeError(f"`ray start --head` failed twice; last output:\n{proc.stdout}{proc.stderr}")

    def stop(self) -> None:
        if self.alive():
            subprocess.run([RAY, "stop", "--force"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[SharedRay]:
    ray = SharedRay()
    yield ray
    ray.stop()


class MlflowServer:
    """A real `mlflow server` on loopback (sqlite backend, proxied artifact store) that tests can stop and restart."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--workers",
            "1",
        ]
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not come up: {(self.root / 'server.log').read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(30)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    yield server
    server.stop()


MODEL_NAME = "shapes-detector"

# The learning run: the shipped smoke experiment as a user runs it (2 gloo workers on the CPU).
LEARN_EPOCHS = 12  # mAP50 0.644, mAP50-95 0.454 here (2026-12-02): past the bars (test_launcher.py)


def smoke_run(storage: Path, shapes: Path, name: str, *overrides: str, env: dict | None = None, flags: tuple = ()):
    """The shipped smoke experiment as the learning run trains it (same data and epochs), with `flags` and
    `overrides`: (run directory, the CLI's process)."""
    proc = yolo_ray(
        "train",
        *flags,
        str(REPO / "experiments" / "smoke.yaml"),
        f"data.dir={shapes}",
        f"train.epochs={LEARN_EPOCHS}",
        f"run.storage_path={storage}",
        f"run.name={name}",
        *overrides,
        cwd=storage,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-5000:]
    return storage / name, proc


@pytest.fixture(scope="session")
def ddp_run(
    shapes: Path, mlflow_server: MlflowServer, shared_ray: SharedRay, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    tracking = (f"tracking.uri={mlflow_server.uri}", f"tracking.model_name={MODEL_NAME}")
    run_dir, _ = smoke_run(tmp_path_factory.mktemp("ddp_run"), shapes, "learn", *tracking, env=shared_ray.env())
    return run_dir


DEVICE_RUN = ("data.loader=device", "tracking.enabled=false")


@pytest.fixture(scope="session")
def device_run(shapes: Path, shared_ray: SharedRay, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The learning run on the device loader (its augmentation draws from its own seeded generators, so the
    training is the same whatever else the process does: async validation's reference)."""
    run_dir, _ = smoke_run(tmp_path_factory.mktemp("device_run"), shapes, "device", *DEVICE_RUN, env=shared_ray.env())
    return run_dir


RERUN_EPOCHS, RERUN_FAILS_AFTER = 5, 3


@dataclass
class Rerun:
    """A run that failed after epoch RERUN_FAILS_AFTER with no retries, then the same command run again."""

    run_dir: Path
    failed: subprocess.CompletedProcess
    failed_summary: dict  # summary.json as the failed attempt left it
    failed_epochs: list[int]  # history.jsonl's epochs as the failed attempt left them
    resumed: subprocess.CompletedProcess
    longer: subprocess.CompletedProcess  # between the two: the same command asking for more epochs


@pytest.fixture(scope="session")
def rerun_after_failure(
    shapes_small: Path, mlflow_server: MlflowServer, shared_ray: SharedRay, tmp_path_factory: pytest.TempPathFactory
) -> Rerun:
    """run.max_failures=0 and a fault after epoch 3: the run fails; the same command resumes it (driver-level
    resume). Logged to MLflow and registered under MODEL_NAME: a barely trained version of the learn run's model
    (test_tracking's promotion check); test_faults checks the recovery."""
    storage = tmp_path_factory.mktemp("rerun")
    args = small_run(
        shapes_small,
        storage,
        "rerun",
        f"train.epochs={RERUN_EPOCHS}",
        "run.max_failures=0",
        "tracking.enabled=true",
        f"tracking.uri={mlflow_server.uri}",
        f"tracking.model_name={MODEL_NAME}",
    )
    run_dir = storage / "rerun"
    # --verbose: this run's output is also the check that everything Ray and Ultralytics say can be seen
    fail_env = {**ENV, "YOLO_RAY_FAIL_AT": f"{RERUN_FAILS_AFTER}:0"}
    failed = yolo_ray("train", "--verbose", *args, cwd=storage, env=fail_env)
    failed_summary = json.loads((run_dir / "summary.json").read_text())
    failed_epochs = [h["epoch"] for h in read_jsonl(run_dir / "history.jsonl")]
    # what a worker killed inside a checkpoint report leaves: its staging directory (last.pt linked, no meta.json)
    stale = run_dir / "train" / "weights" / f"{STAGING_PREFIX}killed"
    stale.mkdir()
    os.link(run_dir / "train" / "weights" / "last.pt", stale / "last.pt")
    # a resume with a longer schedule would train to the old one without a word: refused before Ray starts
    longer = yolo_ray("train", *args, f"train.epochs={RERUN_EPOCHS + 3}", cwd=storage)
    resumed = yolo_ray("train", *args, cwd=storage, env=shared_ray.env())  # the rerun may find another Ray
    return Rerun(run_dir, failed, failed_summary, failed_epochs, resumed, longer)


# ------------------------------------------------------------------ a real 2-node cluster on one machine

NS, HEAD_IF, NODE_IF = "yolo_ray_n1", "yr-veth0", "yr-veth1"
HEAD_IP, NODE_IP, PORT = "10.213.0.1", "10.213.0.2", 6391


def _sh(*cmd: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


RAY = str(Path(sys.executable).parent / "ray")
# Nodes run jobs too: their shell must find this venv's `yolo-ray`.
NODE_ENV = {**ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}


def _teardown() -> None:
    _sh(RAY, "stop", "--force", check=False, env=ENV)
    _sh("ip", "netns", "del", NS, check=False)
    _sh("ip", "link", "del", HEAD_IF, check=False)


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[str]:
    """Head (with dashboard and Jobs API) in this namespace, a second node in its own network namespace.

    Yields the GCS address; the Jobs API is at http://HEAD_IP:8265. Nodes and namespace are removed even on failure.
    """
    try:
        start_head()
        start_node()
        yield f"{HEAD_IP}:{PORT}"
    finally:
        _teardown()


# The GCS declares a node dead after this many failed health checks this far apart (Ray's defaults: 5, 3 s): a killed
# node's raylet refuses the checks at once, so the tests' clusters learn of a lost node in ~2 s instead of ~15 s
# (what follows, Ray Train's start timeouts, still takes most of a restart: README, "Elastic runs and preemption").
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4"}


def start_head(**env: str) -> None:
    """The head node (1 CPU, dashboard and Jobs API) in this namespace, and the second namespace ready for a node;
    env: more variables for its processes (Ray Train's controller runs there)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.fail("the multi-node tests need root and iproute2 (.ci/run installs iproute2)")
    _teardown()
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
        RAY,
        "start",
        "--head",
        f"--node-ip-address={HEAD_IP}",
        f"--port={PORT}",
        "--num-cpus=1",
        "--include-dashboard=true",
        f"--dashboard-host={HEAD_IP}",
        "--disable-usage-stats",
        env={**NODE_ENV, "GLOO_SOCKET_IFNAME": HEAD_IF, **FAST_NODE_DEATH, **env},
    )


def start_node() -> None:
    """Start the second node's raylet in its namespace and wait until the head sees both nodes alive."""
    _sh(
        "ip",
        "netns",
        "exec",
        NS,
        RAY,
        "start",
        f"--address={HEAD_IP}:{PORT}",
        f"--node-ip-address={NODE_IP}",
        "--num-cpus=1",
        "--disable-usage-stats",
        env={**NODE_ENV, "GLOO_SOCKET_IFNAME": NODE_IF},
    )
    deadline = time.time() + 60
    while time.time() < deadline:  # both nodes registered and the Jobs API answering
        try:
            with urllib.request.urlopen(f"http://{HEAD_IP}:8265/api/v0/nodes", timeout=5) as r:
                nodes = json.loads(r.read())["data"]["result"]["result"]
            if sum(n["state"] == "ALIVE" for n in nodes) == 2:
                return
        except OSError:
            pass
        time.sleep(1)


def kill_node() -> int:
    """SIGKILL every process of the second node (raylet, its Ray workers), as when that machine dies. Returns how
    many processes were killed."""
    pids = [int(p) for p in _sh("ip", "netns", "pids", NS).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def trainer_overrides(data: Path, project: Path, name: str, **changes: Any) -> dict[str, Any]:
    """Ultralytics' train arguments for a trainer built in the test's process: yolo11n at 64 px, 8 a batch, CPU."""
    base = {"model": "yolo11n.yaml", "data": str(data / "data.yaml"), "epochs": 2, "imgsz": 64, "batch": 8}
    base |= {"workers": 0, "amp": False, "plots": False, "close_mosaic": 0, "device": "cpu"}
    return {**base, "project": str(project), "name": name, **changes}

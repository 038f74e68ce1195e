"""One driver per run directory (yolo_ray/driver/run_lock.py), with real flock locks held by real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, yolo_ray

from yolo_ray.config import ConfigError
from yolo_ray.driver import run_lock

HOLD = """
import sys, time
from pathlib import Path
from yolo_ray.driver import run_lock
with run_lock.hold(Path(sys.argv[1]), "exp.yaml"):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_driver_fails_and_a_killed_one_leaves_no_stale_lock(tmp_path: Path) -> None:
    first = _holder(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(ConfigError) as err, run_lock.hold(tmp_path, "exp.yaml", wait_s=1.0):
            pass
        assert time.monotonic() - started >= 1.0  # it waited (a killed sweep's trial actors die a moment late)
        msg = str(err.value)
        assert err.value.key == "run.name" and f"pid {first.pid}" in msg and "Fix:" in msg and "exp.yaml" in msg
    finally:
        os.kill(first.pid, signal.SIGKILL)  # no cleanup code runs: the kernel drops the lock
        first.wait()
    with run_lock.hold(tmp_path, "exp.yaml", wait_s=0):
        assert f"pid {os.getpid()}" in (tmp_path / run_lock.LOCK_FILE).read_text()
    with run_lock.hold(tmp_path, "exp.yaml", wait_s=0):  # released on exit, re-acquired by the same process
        pass


def test_a_driver_waits_for_a_holder_that_exits(tmp_path: Path) -> None:
    first = _holder(tmp_path)
    subprocess.Popen(["sh", "-c", f"sleep 1; kill {first.pid}"])
    with run_lock.hold(tmp_path, None, wait_s=20):
        assert first.wait(timeout=5) != 0


def test_cli_refuses_a_run_that_another_driver_holds(tmp_path: Path, shapes: Path) -> None:
    """`yolo-ray train` of a run.name still training: exit code 2 with the holder and the fix, before Ray starts."""
    run_dir = tmp_path / "busy"
    run_dir.mkdir()
    first = _holder(run_dir)
    try:
        proc = yolo_ray(
            "train",
            str(REPO / "experiments" / "smoke.yaml"),
            f"data.dir={shapes}",
            f"run.storage_path={tmp_path}",
            "run.name=busy",
            "tracking.enabled=false",
            cwd=tmp_path,
            timeout=120,
        )
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert f"pid {first.pid}" in proc.stdout and "run.name" in proc.stdout and "Fix:" in proc.stdout
    assert "[yolo_ray] ray:" not in proc.stdout and not (run_dir / "config.yaml").exists()

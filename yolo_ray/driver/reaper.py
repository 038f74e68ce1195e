"""A private local Ray leaves nothing behind when its driver is killed.

Ray's own reaper stops the GCS, the raylet and the workers when the driver dies, but its dashboard and runtime-env
agents (started by the raylet) outlive it: adopted by init, still running a minute later, ignoring SIGTERM. The
driver starts this watcher once its local Ray is up, with the processes Ray started then; when the driver is gone,
the watcher gives Ray a few seconds to stop by itself and kills whatever of those processes is left.

    python -m yolo_ray.driver.reaper DRIVER_PID PID:CREATE_TIME ...
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

GRACE_S = 5.0  # Ray's own shutdown, first


def watch(driver: int, processes: list[psutil.Process], poll_s: float = 0.5, grace_s: float = GRACE_S) -> int:
    """Wait for `driver` to exit, then SIGKILL every one of `processes` still alive after grace_s; returns how many."""
    while _alive(driver):
        time.sleep(poll_s)
    time.sleep(grace_s)
    left = [p for p in processes if p.is_running()]  # is_running: the same process (pid and creation time)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    return len(left)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # killed, not yet waited for: gone
    except psutil.Error:
        return False


def start(driver: int) -> subprocess.Popen | None:
    """Watch `driver` and the processes it has started so far (its local Ray), from a process of its own session
    (a kill of the driver's process group does not reach it)."""
    try:
        ray_processes = psutil.Process(driver).children(recursive=True)
    except psutil.Error:
        return None
    args = [f"{p.pid}:{p.create_time()}" for p in ray_processes]
    return subprocess.Popen(
        [sys.executable, "-m", "yolo_ray.driver.reaper", str(driver), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _process(spec: str) -> psutil.Process | None:
    pid, created = spec.split(":")
    try:
        p = psutil.Process(int(pid))
    except psutil.Error:
        return None
    return p if abs(p.create_time() - float(created)) < 1e-3 else None  # a reused pid is someone else's


if __name__ == "__main__":
    watch(int(sys.argv[1]), [p for p in map(_process, sys.argv[2:]) if p is not None])

"""One driver per run directory: a second `yolo-ray train` of a run.name that is still training fails with a clear
error instead of two drivers appending to one history, pruning one checkpoint list and writing one MLflow run."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from yolo_ray import run_layout as layout
from yolo_ray.config import ConfigError

LOCK_FILE = layout.DRIVER_LOCK
# A killed sweep's trial actors die shortly after their driver: the resumed trial waits them out; and a driver
# started while another finishes the run waits to find it finished. YOLO_RAY_LOCK_WAIT_S sets it.
WAIT_S = float(os.environ.get("YOLO_RAY_LOCK_WAIT_S", "30"))


@contextlib.contextmanager
def hold(run_dir: Path, source: str | None, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold run_dir's lock while the body runs. flock: the kernel releases it when the holder exits, however it
    ends (a SIGKILLed driver leaves no stale lock), and NFS clients map it to a server-side lock."""
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, path, run_dir, source, wait_s)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def _acquire(fd: int, path: Path, run_dir: Path, source: str | None, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = path.read_text().strip() or "another process"
                raise ConfigError(
                    source,
                    "run.name",
                    f"the run directory {run_dir} is in use by another driver ({holder}).",
                    "wait for that run to end (or stop it), or choose another run.name.",
                ) from None
            time.sleep(0.5)

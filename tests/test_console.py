"""What the driver prints of its workers' forwarded output: Ray's known noise goes, everything else stays."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from yolo_ray.console import TRAINING_STARTS, without_noise
from yolo_ray.progress import PROGRESS, EpochConsole

# As Ray Train 2.60's controller logs a resource request that timed out on a loaded host (shortened)
TIMED_OUT = [
    "Failed to send resource request for train-3fcc5d17. If this only happens transiently during network partition or"
    " CPU being overloaded, it's safe to ignore this error.",
    "Traceback (most recent call last):",
    '  File ".../autoscaling_coordinator_client.py", line 58, in send_resource_request',
    "    ray.get(",
    "           ^^^^^^^^^^^^^^^^^^^",
    '  File "python/ray/includes/common.pxi", line 107, in ray._raylet.check_status',
    "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
]
# As Ray Data's prefetcher thread logs in a Train worker whose group is torn down after another rank failed
PREFETCH_HINT = [
    "Error in prefetcher thread.",
    "Traceback (most recent call last):",
    '  File ".../ray/data/_internal/block_batching/util.py", line 513, in _run',
    "    ray.wait(",
    '  File "python/ray/includes/common.pxi", line 117, in ray._raylet.check_status',
    "OSError: Broken pipe",
]
OTHER_FAILURE = [
    "Traceback (most recent call last):",
    '  File "worker.py", line 3, in train',
    "RuntimeError: CUDA out of memory",
]


def test_a_traceback_ray_calls_safe_to_ignore_goes_and_every_other_line_stays() -> None:
    lines = ["[yolo_ray] epoch 1/2 mAP50-95=0.1", *TIMED_OUT, "[yolo_ray] epoch 2/2 mAP50-95=0.2", *OTHER_FAILURE]
    assert without_noise(lines) == ["[yolo_ray] epoch 1/2 mAP50-95=0.1", "[yolo_ray] epoch 2/2 mAP50-95=0.2",
                                    *OTHER_FAILURE]  # fmt: skip


def test_a_traceback_right_after_the_ignored_one_is_kept() -> None:
    """The ignored block ends at its `ray.exceptions.` line: a failure that follows at once is still printed."""
    assert without_noise([*TIMED_OUT, *OTHER_FAILURE]) == OTHER_FAILURE
    assert without_noise([*TIMED_OUT, *TIMED_OUT]) == []


def test_a_failed_prefetch_hint_goes_and_what_follows_stays() -> None:
    """Ray Data's prefetcher logs what fails and carries on (its blocks are still read by the iterator): its block
    goes, closing exception line included; an epoch line and another failure after it stay."""
    assert without_noise([*PREFETCH_HINT, "[yolo_ray] resuming", *OTHER_FAILURE]) == [
        "[yolo_ray] resuming",
        *OTHER_FAILURE,
    ]


def test_ray_noise_lines_go() -> None:
    assert without_noise(["Reporting training result 3", "kept"]) == ["kept"]


def test_the_driver_says_once_when_the_training_loop_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    console = EpochConsole(tmp_path, epochs=2, tty=False, started=time.time() - 42)
    console._poll()
    assert capsys.readouterr().out == ""  # rank 0 has not started its loop yet
    (tmp_path / PROGRESS).write_text(json.dumps({"epoch": 1, "epochs": 2, "batch": 0, "batches": 3, "phase": "train"}))
    console._poll()
    console._poll()
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(TRAINING_STARTS) and 42 <= float(line.split()[3]) < 60, line
    EpochConsole(tmp_path, epochs=2, tty=False)._poll()  # no start given (e.g. the bench's own followers): no line
    assert capsys.readouterr().out == ""


def test_the_worker_loop_imports_no_ultralytics() -> None:
    """A Train worker imports its loop before it sets Ultralytics' environment (quiet unless run.verbose, offline,
    its own settings dir) and before Ray sets the ranks Ultralytics reads at import: an Ultralytics import reached
    from the loop's own imports printed Ultralytics' chatter on every run."""
    code = "import sys, yolo_ray.worker.loop; print('ultralytics' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]

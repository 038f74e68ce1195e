"""What reaches the user's terminal: one line from inside a Ray Train worker, printed once; and, on the driver, the
workers' forwarded output without Ray's known noise.

Ray Train V2 replaces `print` in its workers with a function that logs the message through the root logger and, when
`sys.stdout` is not the interpreter's own (in a Ray worker it never is), also prints it: every `print` reached the
driver twice. Writing to the stream directly sends it once, through Ray's log forwarding like any worker output.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

# Lines Ray's own processes print on every run that tell a user nothing they can act on (verbose keeps them).
RAY_NOISE = (
    # Ray 2.60's C++ core warns about Ray Train's own PreemptionWatcher actor at every start
    "has constructor arguments in the object store and max_restarts > 0",
    # the placement-group cleaner polling a dashboard that is not (yet) up; it keeps polling on its own
    "State API may be temporarily unavailable",
    # torch's rendezvous on a host whose name does not resolve (containers); harmless
    "The hostname of the client socket cannot be retrieved",
    # Ray Train 2.60 logs every report at INFO under a logger named by its file path, which its own log-level
    # filter (RunConfig.logging_config) does not reach; the driver prints each epoch itself
    "Reporting training result",
    # Ray Data's split coordinator (data.loader=stream) at the end of every epoch's pass over the dataset
    "execution finished in",
    "Registered dataset logger for dataset",
    "Starting execution of Dataset",
    # ... and once a run where its progress bars are off (stream_pipeline turns them off unless verbose)
    "Progress bars disabled. To enable",
)
# Tracebacks Ray logs for what is safe to ignore, by their first line: the line, the traceback below it and its
# closing exception line are dropped (verbose keeps them).
RAY_NOISE_TRACEBACKS = (
    # Ray Train 2.60's controller sends its autoscaling coordinator a resource request every few seconds, for a
    # fixed-size group too; on a loaded host the request times out and it logs the traceback ("safe to ignore")
    "Failed to send resource request for train-",
    # Ray Data's prefetcher thread only hints which blocks to fetch and logs what fails instead of raising it; a
    # worker of a group being torn down (another rank failed, data.loader=stream) logs `OSError: Broken pipe` there
    "Error in prefetcher thread.",
)
EXCEPTION_LINE = re.compile(r"^(ray\.exceptions\.|[A-Za-z_][\w.]*(Error|Exception)\b)")  # a traceback's last line


# the driver's line when rank 0's training loop starts (after Ray, the worker group, model and data): start-up ends
TRAINING_STARTS = "[yolo_ray] training starts"


def say(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def filter_forwarded_logs(verbose: bool) -> None:
    """On the driver, after ray.init: forwarded worker lines go through a filter that drops RAY_NOISE (unless
    verbose), and are written so that a progress bar on the same terminal is redrawn below them, not broken.

    Ray prints what its workers write through a handler of its stdstream dispatcher; this swaps that handler for one
    around the same printer. Where a Ray version lacks these (private) names, its own printing stays as it is."""
    try:
        from ray._private import worker as ray_worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        ignore_prefix = ray_worker._should_ignore_worker_log_prefix(ray_worker.global_worker)
        printer = functools.partial(ray_worker.print_to_stdstream, ignore_prefix=ignore_prefix)
        names = [name for name, _ in dispatcher.handlers]
    except (ImportError, AttributeError):
        return
    if "ray_print_logs" not in names:  # log_to_driver is off: nothing is printed anyway
        return
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", functools.partial(_forward, printer=printer, verbose=verbose))


def _forward(data: dict[str, Any], printer: Any, verbose: bool) -> None:
    lines = data.get("lines", [])
    if not verbose:
        lines = without_noise(lines)
    if not lines:
        return
    from tqdm import tqdm

    with tqdm.external_write_mode(file=sys.stdout):  # a bar on the terminal is cleared, then redrawn below
        printer({**data, "lines": lines})


def without_noise(lines: list[str]) -> list[str]:
    """Forwarded lines less RAY_NOISE's, and less each RAY_NOISE_TRACEBACKS block (its line, the traceback's lines,
    which start with `Traceback` or a space, and the exception line that ends it)."""
    out, in_block = [], False
    for line in lines:
        if in_block:
            if line.startswith(("Traceback", " ")):
                continue
            in_block = False
            if EXCEPTION_LINE.match(line):
                continue
        if any(noise in line for noise in RAY_NOISE_TRACEBACKS):
            in_block = True
        elif not any(noise in line for noise in RAY_NOISE):
            out.append(line)
    return out

"""What several commands share: [CONFIG] key=value arguments, --verbose, --tracking-uri."""

from __future__ import annotations

import argparse

VERBOSE_HELP = (
    "also show Ray's and Ultralytics' own output (start-up, model tables, per-batch bars, validation tables); "
    "by default one line per epoch, and a progress bar on a terminal (run.verbose=true)"
)


def ultralytics_help() -> str:
    from yolo_ray.ultralytics_keys import help_text

    return help_text()


def split_args(args: list[str], verbose: bool = False) -> tuple[str | None, list[str]]:
    """[CONFIG] key=value ... -> (config or None, overrides); --verbose is the override run.verbose=true."""
    path, overrides = (args[0], args[1:]) if args and "=" not in args[0] else (None, list(args))
    return path, [*overrides, "run.verbose=true"] if verbose else overrides


def tracking_uri_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI, else runs/mlflow.db")

"""`yolo-ray submit`: a train or tune run submitted to a Ray cluster as a job, followed to its end."""

from __future__ import annotations

import argparse
import os
from typing import Any

from yolo_ray.cli.common import VERBOSE_HELP, split_args


def add(sub: Any) -> None:
    j = sub.add_parser(
        "submit",
        help="submit a train (or --tune) run to a Ray cluster as a job and follow it",
        description="Validates the config here, uploads the working dir (minus .rayignore), runs "
        "`yolo-ray train CONFIG ...` on the cluster, streams its logs and exits with its outcome.",
    )
    j.add_argument("args", nargs="*", metavar="[CONFIG] key=value")
    j.add_argument(
        "--address",
        default=os.environ.get("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:8265"),
        help="the cluster's dashboard/jobs address (default: RAY_API_SERVER_ADDRESS or local)",
    )
    j.add_argument("--tune", action="store_true", help="submit `yolo-ray tune` instead of train")
    j.add_argument("--no-wait", action="store_true", help="print the submission id and return")
    j.add_argument("--working-dir", default=".", help="uploaded as the job's working dir (default: .)")
    j.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    j.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from yolo_ray import config
    from yolo_ray.driver.submit import submit

    path, overrides = split_args(ns.args, ns.verbose)
    cfg = config.load(path, overrides)  # bad input fails here, before anything reaches the cluster
    command = "tune" if ns.tune else "train"
    return submit(ns.address, command, cfg, path, overrides, wait=not ns.no_wait, working_dir=ns.working_dir)

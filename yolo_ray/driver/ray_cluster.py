"""Connecting to Ray and sizing the worker group against what the cluster can ever give."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import ray

from yolo_ray import console
from yolo_ray.config import ConfigError, ExperimentConfig, apply
from yolo_ray.config_checks import check_batch_divides, check_gpu_only, worker_range
from yolo_ray.config_schema import STREAM_READ_CPUS
from yolo_ray.driver import reaper


@dataclass(frozen=True)
class Scaling:
    num_workers: int  # the group's size; an elastic group's most
    use_gpu: bool
    cpus_per_worker: float
    gpus_per_worker: float
    placement_strategy: str
    min_workers: int | None = None  # an elastic group's least (None: fixed)

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None

    @property
    def ray_num_workers(self) -> int | tuple[int, int]:
        """Ray Train's ScalingConfig(num_workers): a number, or (min, max) for an elastic group."""
        return (self.min_workers, self.num_workers) if self.min_workers is not None else self.num_workers

    def describe(self) -> str:
        return f"{self.min_workers}-{self.num_workers} (elastic)" if self.elastic else str(self.num_workers)


def connect(address: str | None, verbose: bool = False) -> str:
    """Attach to `address` (or RAY_ADDRESS, as set by `ray job submit`); else start a private local Ray.

    A local Ray starts with its dashboard (on 127.0.0.1): its state API is what Ray Train's placement-group cleaner
    asks about dead controllers, so the groups of stopped Tune trials are freed (without it they leak and later
    trials wait forever, and every run logs "State API may be temporarily unavailable").
    Not verbose: Ray's own INFO lines stay in its log files, and known noise in forwarded worker output is dropped
    (console.filter_forwarded_logs).
    """
    if ray.is_initialized():
        return "existing"
    address = address or os.environ.get("RAY_ADDRESS")
    level = logging.INFO if verbose else logging.WARNING
    # No runtime_env here: under `ray job submit` the job's own runtime env (working dir, env vars) must apply
    # unmerged; workers set Ultralytics' offline environment themselves (ultralytics_env).
    if address:
        ray.init(address=address, log_to_driver=True, logging_level=level)
        where = address
    else:
        if not verbose:  # "token authentication is enabled": Ray's default for a local Ray, said on every start
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        with _private_address():
            ray.init(address="local", include_dashboard=None, dashboard_host="127.0.0.1", logging_level=level)
        reaper.start(os.getpid())  # a killed driver's agents go too
        where = "local"
    console.filter_forwarded_logs(verbose)
    return where


@contextlib.contextmanager
def _private_address() -> Iterator[None]:
    """A private local Ray whose own processes know its address. Ray's state API, which Ray Train's placement-group
    cleaner calls from inside the cluster, finds "the" local Ray by looking for GCS processes on the host: with a
    second Ray on the machine it finds two and fails ("Found multiple active Ray instances"), and stopped trials'
    groups are never freed. The GCS gets a port chosen here and every process started under it RAY_ADDRESS; the
    driver's own environment is restored once Ray is up."""
    port = _free_port()
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_GCS_SERVER_PORT")}
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)
    os.environ["RAY_ADDRESS"] = f"{ray.util.get_node_ip_address()}:{port}"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# data.stream_decode auto: CPUs on nodes without GPUs from which Ray Data's tasks decode instead of the Train workers
# (a head node's few CPUs do not count)
DECODE_NODE_CPUS = 8


def alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def node_count() -> int:
    return len(alive_nodes())


def uses_gpu(cfg: ExperimentConfig, nodes: list[dict]) -> bool:
    """scaling.use_gpu, `auto` as whether the cluster has GPUs."""
    if cfg.scaling.use_gpu == "auto":
        return sum(n["Resources"].get("GPU", 0) for n in nodes) > 0
    return bool(cfg.scaling.use_gpu)


def with_stream_decode(cfg: ExperimentConfig, nodes: list[dict]) -> ExperimentConfig:
    """`data.stream_decode: auto` decided from the cluster: `cpu` (Ray Data's tasks decode, on any node) where nodes
    without GPUs bring DECODE_NODE_CPUS or more CPUs, or on CPUs; else `worker` (each Train worker's processes
    decode the bytes): on one H100 host it trained at 0.81-0.84x of the in-memory speed against 0.75x with
    Ray Data's tasks, which waited for each epoch's first batch (README, the stream loader)."""
    if cfg.data.loader != "stream" or cfg.data.stream_decode != "auto":
        return cfg
    cpu_nodes = sum(n["Resources"].get("CPU", 0) for n in nodes if not n["Resources"].get("GPU", 0))
    decode = "worker" if uses_gpu(cfg, nodes) and cpu_nodes < DECODE_NODE_CPUS else "cpu"
    return apply(cfg, {"data.stream_decode": decode})


def resolve(cfg: ExperimentConfig) -> Scaling:
    """Turn `auto` into numbers and refuse a worker group this cluster can never place (before any GPU is taken)."""
    sc, src = cfg.scaling, cfg.source
    nodes = alive_nodes()
    total_gpus = sum(n["Resources"].get("GPU", 0) for n in nodes)
    use_gpu = uses_gpu(cfg, nodes)
    if use_gpu and not total_gpus and not sc.autoscaling:
        raise ConfigError(
            src,
            "scaling.use_gpu",
            f"is true, but this Ray cluster ({len(nodes)} node(s)) has no GPUs.",
            "train on CPUs (scaling.use_gpu: false, or device=cpu), or use a cluster with GPUs (scaling.autoscaling: "
            "true if an autoscaler adds GPU nodes).",
        )
    check_gpu_only(cfg, use_gpu, "this run trains on CPUs")
    gpus = sc.gpus_per_worker if use_gpu else 0.0
    least = None
    if sc.num_workers == "auto":
        num_workers = max(1, int(total_gpus // gpus)) if use_gpu else 2
    else:
        least, num_workers = worker_range(sc.num_workers)
        least = least if isinstance(sc.num_workers, list) else None
    if use_gpu and num_workers > 1 and gpus < 1:
        raise ConfigError(
            src,
            "scaling.gpus_per_worker",
            f"{gpus} is a fraction; NCCL refuses two ranks on one GPU.",
            "use gpus_per_worker: 1 for multi-worker runs (fractions suit single-worker tune trials).",
        )
    if least is None:  # an elastic group's batch follows batch_plan's rule at every size
        check_batch_divides(cfg, num_workers)
    auto = sc.cpus_per_worker == "auto"
    cpus = auto_cpus_per_worker(cfg, use_gpu, nodes, gpus or 1.0) if auto else sc.cpus_per_worker
    scaling = Scaling(num_workers, use_gpu, cpus, gpus, sc.placement_strategy, least)
    if not sc.autoscaling:
        check_capacity(cfg, scaling, nodes)
        check_room_for_validation(cfg, scaling, nodes)
        check_room_for_stream(cfg, scaling, nodes)
    return scaling


def auto_cpus_per_worker(
    cfg: ExperimentConfig, use_gpu: bool, nodes: list[dict], gpus_per_worker: float = 1.0
) -> float:
    """`scaling.cpus_per_worker: auto` (and `tune.trial.cpus_per_worker: auto`). A GPU worker gets its loader processes
    plus one for the training process, within its GPUs' share of the smallest GPU node (one CPU of each node left to
    Ray's own actors; a 0.25-GPU trial worker gets a quarter of a GPU's share); one that decodes the stream itself
    (stream_decode worker) gets that share less STREAM_READ_CPUS. It matters beyond scheduling: Ray sets
    a worker's torch threads to its CPUs, and with 1 the training process's own CPU work ran on one thread
    (Ultralytics' loader on an H200: 524 images/s against 641 with the node's CPUs, native 613).
    CPU workers (gloo) get 1: there the two ranks' compute is the CPU."""
    if not use_gpu or gpus_per_worker <= 0:
        return 0.5 if cfg.data.loader == "stream" else 1.0  # stream: Ray Data's reading needs CPUs of its own
    shares = [
        int((n["Resources"].get("CPU", 0) - 1) * gpus_per_worker // n["Resources"]["GPU"])
        for n in nodes
        if n["Resources"].get("GPU", 0) >= 1
    ]
    if cfg.data.loader == "stream" and cfg.data.stream_decoder() == "worker":  # its processes decode: all of its
        return float(max(1, min(shares, default=4) - STREAM_READ_CPUS))  # share but what Ray Data reads bytes with
    # stream: no loader processes; the training process's threads (PNG decoding, copies), the rest to Ray Data
    loader_cpus = 2 if cfg.data.loader == "stream" else cfg.train.workers + 1
    return float(max(1, min([loader_cpus, *shares])))


def check_room_for_validation(cfg: ExperimentConfig, s: Scaling, nodes: list[dict]) -> None:
    """train.val_async: the validation actor's GPUs and CPUs must be left over once the workers are placed (else
    it would wait for resources forever and training with it)."""
    t = cfg.train
    if not t.val_async or t.val_runner == "thread":
        return
    workers = s.min_workers or s.num_workers
    gpus_left = sum(n["Resources"].get("GPU", 0) for n in nodes) - workers * s.gpus_per_worker
    cpus_left = sum(n["Resources"].get("CPU", 0) for n in nodes) - workers * s.cpus_per_worker
    if t.val_gpus > gpus_left + 1e-9:
        raise ConfigError(
            cfg.source,
            "train.val_gpus",
            f"{t.val_gpus:g} GPU for the validation actor, but {workers} workers x {s.gpus_per_worker:g} GPU leave "
            f"{max(gpus_left, 0):g} of the cluster's GPUs.",
            "share the GPUs: scaling.gpus_per_worker: 0.75 with train.val_gpus: 0.25 (one worker per GPU), or one "
            "worker fewer, or train.val_gpus: 0 to validate on CPUs.",
        )
    if t.val_cpus > cpus_left + 1e-9:
        raise ConfigError(
            cfg.source,
            "train.val_cpus",
            f"{t.val_cpus:g} CPU for the validation actor, but the workers leave {max(cpus_left, 0):g}.",
            "lower train.val_cpus or scaling.cpus_per_worker.",
        )


STREAM_MIN_CPUS = 1.0  # CPUs Ray Data needs beside the workers to read (and maybe decode) the stream


def check_room_for_stream(cfg: ExperimentConfig, s: Scaling, nodes: list[dict]) -> None:
    """data.loader=stream: Ray Data's reading tasks need CPUs the workers do not hold (else they never run and
    the first epoch waits forever)."""
    if cfg.data.loader != "stream":
        return
    left = sum(n["Resources"].get("CPU", 0) for n in nodes) - s.num_workers * s.cpus_per_worker
    if left < STREAM_MIN_CPUS - 1e-9:
        raise ConfigError(
            cfg.source,
            "scaling.cpus_per_worker",
            f"{s.num_workers} workers x {s.cpus_per_worker:g} CPU leave {max(left, 0):g} of the cluster's CPUs, but "
            f"data.loader=stream needs at least {STREAM_MIN_CPUS:g} for Ray Data to read the images.",
            "lower scaling.cpus_per_worker (auto leaves room), or add CPU nodes.",
        )


def check_capacity(cfg: ExperimentConfig, s: Scaling, nodes: list[dict]) -> None:
    """Can this (non-autoscaling) cluster ever place num_workers bundles of {CPU, GPU}?"""
    placeable = 0
    per_node = []
    for n in nodes:
        cpu, gpu = n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)
        fits = int(cpu // s.cpus_per_worker) if s.cpus_per_worker else 10**6
        if s.gpus_per_worker:
            fits = min(fits, int(gpu // s.gpus_per_worker))
        per_node.append(fits)
        placeable += fits
    if s.placement_strategy in ("STRICT_SPREAD",):
        placeable = sum(1 for f in per_node if f > 0)
    elif s.placement_strategy == "STRICT_PACK":
        placeable = max(per_node, default=0)
    needed = s.min_workers or s.num_workers  # an elastic group starts once its least fits
    if needed > placeable:
        what = f"{s.cpus_per_worker:g} CPU" + (f" + {s.gpus_per_worker:g} GPU" if s.gpus_per_worker else "")
        raise ConfigError(
            cfg.source,
            "scaling.num_workers",
            f"{needed} workers of {what} each can never be placed: the cluster "
            f"({len(nodes)} node(s)) fits at most {placeable} with placement "
            f"{s.placement_strategy}.",
            f"set scaling.num_workers <= {placeable}, lower scaling.cpus_per_worker, or use a larger "
            "cluster (scaling.autoscaling: true if an autoscaler will add nodes).",
        )

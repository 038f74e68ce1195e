"""What a benchmark variant uses of the machine while it runs: CPU and GPU utilisation and its own peak GPU memory
(nvidia-smi, sampled every second)."""

from __future__ import annotations

import statistics
import subprocess
import threading
from typing import Any


class Sampler:
    """CPU and GPU utilisation and peak GPU memory, sampled every second while a variant runs (its whole wall time,
    start-up and final validation included), over the first `devices` GPUs: the ones the variant trains on.

    Memory is the variant's own: what its processes (the driver `pid` and every process it started: Ray's workers,
    torch.distributed's ranks) hold on one GPU, the most on any. The bench process's own leftovers (the ceilings'
    cached blocks and graph pools) and other tenants are not counted, as nvidia-smi's memory.used would count them.
    Where nvidia-smi lists no processes (a container that hides them), memory.used above its level at the first
    sample stands in."""

    def __init__(self, devices: int) -> None:
        self.devices = devices
        self.pid: int | None = None  # the variant's driver, set once it has started
        self.cpu: list[float] = []
        self.gpu: list[float] = []
        self.mem_mib = 0.0
        self._baseline: list[float] | None = None  # memory.used per GPU at the first sample: the fallback's zero
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import psutil

        psutil.cpu_percent(None)
        while not self._stop.wait(1.0):
            self.cpu.append(psutil.cpu_percent(None))
            try:
                gpus = _nvidia_smi("--query-gpu=index,uuid,utilization.gpu,memory.used")[: self.devices]
                apps = _nvidia_smi("--query-compute-apps=gpu_uuid,pid,used_memory")
            except (OSError, subprocess.SubprocessError, ValueError):
                continue
            if not gpus:
                continue
            self.gpu.append(statistics.mean(float(g[2]) for g in gpus))
            used = [float(g[3]) for g in gpus]
            self._baseline = self._baseline or used
            if apps:
                pids = process_tree(self.pid) if self.pid else set()
                self.mem_mib = max(self.mem_mib, variant_mem_mib(gpus, apps, pids))
            else:
                self.mem_mib = max(self.mem_mib, *(u - b for u, b in zip(used, self._baseline, strict=True)))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float | None]:
        return {
            "cpu_util_pct": round(statistics.mean(self.cpu), 1) if self.cpu else None,
            "gpu_util_pct": round(statistics.mean(self.gpu), 1) if self.gpu else None,
            "peak_gpu_mem_gib": round(self.mem_mib / 1024, 2) if self.mem_mib else None,
        }


def _nvidia_smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5, check=True
    )
    return [[c.strip() for c in r.split(",")] for r in out.stdout.strip().splitlines() if r.strip()]


def process_tree(pid: int) -> set[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:  # exited between samples
        return set()


def variant_mem_mib(gpus: list[list[str]], apps: list[list[str]], pids: set[int]) -> float:
    """The most MiB that `pids` hold together on any one of `gpus` ([index, uuid, ...] rows), from nvidia-smi's
    compute apps ([gpu_uuid, pid, used MiB] rows)."""
    per_gpu = dict.fromkeys((g[1] for g in gpus), 0.0)
    for uuid, pid, used in apps:
        if uuid in per_gpu and pid.isdigit() and int(pid) in pids and used.replace(".", "", 1).isdigit():
            per_gpu[uuid] += float(used)
    return max(per_gpu.values(), default=0.0)

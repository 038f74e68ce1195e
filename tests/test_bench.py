"""`yolo-ray bench --cpu`: the benchmark runs end to end on a tiny configuration (no speed targets in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import yolo_ray

from yolo_ray.bench import environment
from yolo_ray.bench.gpu_sampler import process_tree, variant_mem_mib
from yolo_ray.bench.throughput import _derive, plan
from yolo_ray.bench.time_to_accuracy import reached, tta_batches
from yolo_ray.bench.variant_run import BenchSettings, phases, steady_images_per_s
from yolo_ray.config import ConfigError


def test_steady_state_drops_first_and_validating_epochs() -> None:
    # epoch 1, its one-off end (first save/report) inside gap 1, two steady gaps, the last epoch validates
    rows = [{"time": 10.0}, {"time": 17.0}, {"time": 21.0}, {"time": 25.0}, {"time": 40.0}]
    assert steady_images_per_s(rows, 400) == (100.0, 4.0)
    short = [{"time": 10.0}, {"time": 14.0}, {"time": 30.0}]  # 3 epochs: only the middle gap is left
    assert steady_images_per_s(short, 400) == (100.0, 4.0)


def test_peak_memory_counts_the_variants_processes_alone() -> None:
    """A variant's GPU memory is what its driver and every process under it (Ray's workers are the driver's
    grandchildren) hold on one GPU; the bench process's own leftovers and strangers' processes are not counted."""
    sleep = "import time; time.sleep(60)"
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleep!r}]); {sleep}"
    with subprocess.Popen([sys.executable, "-c", code]) as driver:
        try:
            for _ in range(100):  # until the grandchild has started
                tree = process_tree(driver.pid)
                if len(tree) == 2:
                    break
                time.sleep(0.05)
            assert len(tree) == 2 and driver.pid in tree and os.getpid() not in tree
            worker = max(tree - {driver.pid})
            gpus = [["0", "GPU-a", "50", "9000"], ["1", "GPU-b", "40", "3000"]]
            apps = [
                ["GPU-a", str(os.getpid()), "7000"],  # the bench process: the ceilings' leftovers
                ["GPU-a", str(worker), "2000"],
                ["GPU-a", str(driver.pid), "500"],
                ["GPU-b", str(worker), "3000"],
                ["GPU-c", str(worker), "9999"],  # a GPU the variant does not train on
                ["GPU-b", "1", "[N/A]"],
            ]
            assert variant_mem_mib(gpus, apps, tree) == 3000.0  # the most on one GPU: 2500 on a, 3000 on b
            assert variant_mem_mib(gpus, apps, set()) == 0.0
        finally:
            for pid in process_tree(driver.pid):
                os.kill(pid, 9)
    assert process_tree(driver.pid) == set()  # exited: nothing left to count


def test_gpu_plan_runs_every_variant_side_by_side() -> None:
    """On GPUs one run holds native, yolo_ray with Ultralytics' loader, the device path eager and with CUDA graphs,
    at 64 and 256 images per GPU, on 1 and on all GPUs (graphs only where CUDA is)."""
    variants = {name: (args, n, batch) for name, args, n, batch in plan(BenchSettings(), gpus=2, cpu=False)}
    paths = ("", "-device", "-graphs", "-device-b256", "-graphs-b256")
    assert set(variants) == {"native-1gpu", "native-ddp-2gpu", *(f"yolo_ray{p}-{n}gpu" for p in paths for n in (1, 2))}
    assert "train.cuda_graphs=true" in variants["yolo_ray-graphs-2gpu"][0]
    assert "train.cuda_graphs=true" not in variants["yolo_ray-device-2gpu"][0]
    assert variants["yolo_ray-graphs-b256-1gpu"][1:] == (1, 256)
    assert not any("graphs" in name for name, *_ in plan(BenchSettings.cpu(), gpus=0, cpu=True))
    sharded = {name: args for name, args, *_ in plan(BenchSettings(device_cache="sharded"), gpus=2, cpu=False)}
    assert "data.device_cache=sharded" in sharded["yolo_ray-graphs-2gpu"]  # every device-loader variant, no other
    assert not any("device_cache" in a for a in sharded["yolo_ray-2gpu"] + sharded["native-ddp-2gpu"])


def test_gpu_counts_give_a_scaling_curve_with_native_ddp_at_each_count() -> None:
    curve = BenchSettings(gpu_counts="1,2,4", only="native-1gpu,native-ddp-2gpu,native-ddp-4gpu,yolo_ray-graphs-4gpu")
    variants = {name: (args, n) for name, args, n, _ in plan(curve, gpus=4, cpu=False)}
    assert set(variants) == {"native-1gpu", "native-ddp-2gpu", "native-ddp-4gpu", "yolo_ray-graphs-4gpu"}
    assert variants["native-ddp-2gpu"] == (["--native", "--device", "0,1"], 2)
    assert variants["yolo_ray-graphs-4gpu"][1] == 4
    with pytest.raises(ConfigError, match="gpu_counts: 1,8 must lie in 1..4"):
        plan(BenchSettings(gpu_counts="1,8"), gpus=4, cpu=False)


def test_ratios_scaling_vs_native_and_vs_ceiling() -> None:
    def row(name: str, gpus: int, ips: float, batch: int = 64) -> dict:
        return {"name": name, "gpus": gpus, "images_per_s": ips, "batch_per_gpu": batch}

    report = {
        "gpus": 2,
        "results": [
            row("cuda-step-ceiling-b64", 1, 1000.0),
            row("cuda-step-ceiling-graphs-b64", 1, 2000.0),  # not the reference
            row("native-1gpu", 1, 500.0),
            row("native-ddp-2gpu", 2, 800.0),
            row("yolo_ray-graphs-1gpu", 1, 900.0),
            row("yolo_ray-graphs-2gpu", 2, 1710.0),
            {"name": "yolo_ray-device-2gpu", "gpus": 2, "error": "boom"},
        ],
    }
    _derive(report)
    rows = {r["name"]: r for r in report["results"]}
    assert rows["native-ddp-2gpu"]["speedup_vs_1"] == 1.6 and rows["native-ddp-2gpu"]["scaling_efficiency"] == 0.8
    assert rows["yolo_ray-graphs-2gpu"]["speedup_vs_1"] == 1.9
    assert rows["yolo_ray-graphs-1gpu"]["ratio_vs_native"] == 1.8
    assert rows["yolo_ray-graphs-2gpu"]["ratio_vs_native"] == 2.138  # vs native DDP at the same count
    assert rows["yolo_ray-graphs-2gpu"]["fraction_of_ceiling_per_device"] == 0.855  # the eager ceiling
    assert "speedup_vs_1" not in rows["yolo_ray-graphs-1gpu"] and "ratio_vs_native" not in rows["native-1gpu"]


def test_time_to_accuracy_in_both_clocks() -> None:
    """The first epoch at or above native's mAP counts, timed as the run went (validation included) and by its
    batch loops alone; each speedup is native's time over ours."""
    csv = [{"epoch": e, "metrics/mAP50-95(B)": m, "time": 5.0 * e} for e, m in [(1, 0.1), (2, 0.5), (3, 0.8), (4, 0.7)]]
    history = [{"epoch": e, "train_time_s": 2.0, "val_s": 2.5} for e in range(1, 5)]
    native = {"s_to_target": 30.0, "loop_s_to_target": 12.0}
    out = reached(csv, history, 0.75, native)
    assert out["epoch_reached"] == 3 and out["s_to_target"] == 15.0 and out["loop_s_to_target"] == 6.0
    assert out["speedup"] == 2.0 and out["loop_speedup"] == 2.0 and out["best_mAP50-95"] == 0.8
    assert out["val_s_median"] == 2.5
    assert reached(csv, history, 0.9, native)["epoch_reached"] is None  # never reached: no times, no speedup
    assert tta_batches(BenchSettings(tta_batch_per_gpu="256,128")) == [256, 128]
    assert tta_batches(BenchSettings()) == [256]  # throughput mode's batch by default


def test_packages_every_process_compiles_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package without bytecode where Python writes none (the GPU image's torch, compiled by every process of a
    yolo_ray run) is named in the benchmark's JSON and its warning; compiled, or where Python writes bytecode, not."""
    import py_compile

    pkg = tmp_path / "slowpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert environment.uncompiled(("slowpkg", "no_such_package")) == ["slowpkg"]
    assert "slowpkg" in environment.warning(["slowpkg"]) and "compileall" in environment.warning(["slowpkg"])
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert environment.uncompiled(("slowpkg",)) == []  # its first import writes the cache
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    py_compile.compile(str(pkg / "__init__.py"))
    assert environment.uncompiled(("slowpkg",)) == []


def test_cpu_bench_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = yolo_ray(
        "bench",
        "--cpu",
        f"data_dir={tmp_path / 'data'}",
        f"out_dir={tmp_path / 'runs'}",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = json.loads(out.read_text())
    assert report["uncompiled_packages"] == []  # scripts/setup.sh compiles the venv as pip would
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) == {"native-1cpu", "yolo_ray-2cpu", "yolo_ray-device-2cpu", "cpu-step-ceiling-b8"}
    assert all("error" not in r and r["images_per_s"] > 0 for r in rows.values()), rows
    assert rows["yolo_ray-device-2cpu"]["fraction_of_ceiling_per_device"] > 0
    profile = rows["yolo_ray-device-2cpu"]["profile"]  # run.profile_steps=2: where rank 0's steps went
    assert profile["steps"] == 2 and profile["wall_ms_per_step"] > 0
    assert 0 < profile["yolo_ray.augment_cpu_ms_per_step"] < profile["wall_ms_per_step"]
    assert rows["native-1cpu"]["profile"] is None
    for name in ("yolo_ray-2cpu", "yolo_ray-device-2cpu"):  # the epoch split: loop, Ultralytics' end, report, writer
        r = rows[name]
        assert r["loop_images_per_s"] > 0 and r["save_s"] > 0 and r["report_s"] > 0 and r["checkpoint_write_s"] > 0, r
    assert rows["native-1cpu"]["loop_images_per_s"] is None
    assert report["commit"] and report["commit_dirty"] in (True, False) and report["settings"]["imgsz"] == 64
    assert "images_per_s" in proc.stdout and "yolo_ray-2cpu" in proc.stdout  # the printed table


def test_a_run_clock_splits_at_the_loop_start_and_end_lines_of_native_and_of_yolo_ray() -> None:
    yolo = [
        (12.0, "[yolo_ray] ray: local | workers: 1 x GPU\n"),
        (40.5, "[yolo_ray] training starts 40.1 s after the run started (Ray, workers, model, data)\n"),
        (52.0, "[yolo_ray] epoch 1/2 mAP50=0\n"),
        (55.0, "[yolo_ray] epoch 2/2 mAP50=0.1\n"),
        (61.0, "[yolo_ray] done: mAP50=0.1\n"),
    ]
    assert phases(yolo, 63.0) == {"startup_s": 40.5, "loop_s": 14.5, "end_s": 8.0}
    native = [(9.0, "Starting training for 2 epochs...\n"), (30.0, "2 epochs completed in 0.006 hours.\n")]
    assert phases(native, 35.0) == {"startup_s": 9.0, "loop_s": 21.0, "end_s": 5.0}
    assert phases(yolo[:1], 20.0)["startup_s"] is None

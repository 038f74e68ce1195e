"""`yolo-ray bench --parity --cpu`: every CPU path over two seeds on real-shaped scenes, scored twice, end to end."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ENV, yolo_ray

from yolo_ray.bench import parity as harness
from yolo_ray.bench import parity_report
from yolo_ray.bench.run_ledger import RunLedger
from yolo_ray.config import ConfigError, parse_overrides

LOSSES = ("train/box_loss", "train/cls_loss", "train/dfl_loss")


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("parity")
    out = work / "parity.json"
    # two runs at once: the harness's concurrency, and two private local Rays side by side on one host
    proc = yolo_ray("bench", "--parity", "--cpu", "parallel=2", "--out", str(out), cwd=work, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "parity on real-shaped data" in proc.stdout
    return work, json.loads(out.read_text())


def _losses(run_dir: Path) -> list[float]:
    """Each epoch's training losses, flat: box, cls, dfl of epoch 1, then of epoch 2, ..."""
    with open(run_dir / "train" / "results.csv") as f:
        return [float(row[k]) for row in csv.DictReader(f) for k in LOSSES]


def test_every_path_and_seed_is_scored_twice(parity: tuple[Path, dict]) -> None:
    """Each path trains each seed; Ultralytics' validator and pycocotools score every run's weights (with COCO's AP
    by object size); the summary gives mean and spread over the seeds and the difference from native's mean."""
    _, report = parity
    runs = report["results"]
    assert [r.get("error") for r in runs] == [None] * 6
    assert {(r["path"], r["seed"]) for r in runs} == {
        (p, s) for p in ("native", "ultralytics", "device") for s in (0, 1)
    }
    for r in runs:
        assert set(r["coco"]) >= {"AP", "AP50", "AP_small", "AP_medium", "AP_large"}
        assert math.isfinite(r["ultralytics"]["mAP50-95"]) and math.isfinite(r["coco"]["AP"])
        assert r["scorers_differ_by"] <= 0.01
        assert r["train_s"] > 0 and r["wall_s"] > r["train_s"]
        if r["path"] != "native":  # yolo_ray's history: the epoch's end, after its batch loop, on the same epochs
            assert 0 < r["end_of_epoch_s"] < r["epoch_s"], r
    rows = {row["path"]: row for row in report["summary"]}
    assert set(rows) == {"native", "ultralytics", "device"}
    for path in ("ultralytics", "device"):
        assert rows[path]["seeds"] == [0, 1] and set(rows[path]["mAP50-95"]) == {"mean", "std", "min", "max"}
        assert "vs_native_mAP50-95" in rows[path] and "at_parity" in rows[path]


def test_two_private_rays_on_one_host_keep_apart(parity: tuple[Path, dict]) -> None:
    """Runs that overlapped, each with its own local Ray: Ray Train's placement-group cleaner found both Rays ("Found
    multiple active Ray instances", a traceback in every run, stopped trials' groups never freed); each private Ray's
    processes now know its address."""
    work, report = parity
    runs = [r for r in report["results"] if r["path"] != "native"]
    overlapped = [r for r in runs if any(o is not r and o["started"] < r["ended"] and r["started"] < o["ended"]
                                          for o in runs)]  # fmt: skip
    assert overlapped, "no two yolo_ray runs overlapped"
    out_dir = Path(report["settings"]["out_dir"])
    logs = [((out_dir if out_dir.is_absolute() else work / out_dir) / f"{r['name']}.log").read_text() for r in runs]
    assert not [log for log in logs if "multiple active Ray instances" in log or "Traceback" in log]


def test_one_worker_with_ultralytics_loader_is_native_step_for_step(parity: tuple[Path, dict]) -> None:
    """yolo_ray on one worker with Ultralytics' loader trains native Ultralytics' model: the same losses in every
    epoch for the same seed (on one H200 the final mAP50-95 agreed to every digit at two seeds)."""
    work, report = parity
    runs = Path(report["settings"]["out_dir"])
    runs = runs if runs.is_absolute() else work / runs
    for seed in (0, 1):
        native, ours = _losses(runs / f"native-e2-s{seed}"), _losses(runs / f"ultralytics-e2-s{seed}")
        assert len(native) == 2 * len(LOSSES) and native == pytest.approx(ours, rel=1e-5)


def test_one_worker_device_loader_draws_a_new_epoch_each_epoch(parity: tuple[Path, dict]) -> None:
    """The device loader of a one-worker run serves each epoch's own shuffle and augmentations. Ultralytics calls
    sampler.set_epoch only when WORLD_SIZE > 1, so one worker replayed epoch 0's batches in every epoch (on one H200:
    mAP50-95 2.1 points under native's mean over five seeds of real-shaped data)."""
    work, report = parity
    runs = Path(report["settings"]["out_dir"])
    runs = runs if runs.is_absolute() else work / runs
    for seed in (0, 1):
        record = json.loads((runs / f"device-e2-s{seed}" / "ranks" / "rank0.json").read_text())
        assert record["world_size"] == 1 and record["loader_epochs"] == [0, 1]


# ------------------------------------------------------------------------------------ the harness itself (no runs)


def _row(name: str, score: float, started: float = 0.0, ended: float = 1.0, **kw: object) -> dict:
    m = harness.RUN_NAME.match(name)
    assert m
    return {
        "name": name,
        "path": m["path"],
        "epochs": int(m["epochs"]),
        "seed": int(m["seed"]),
        "started": started,
        "ended": ended,
        "ultralytics": {"mAP50-95": score, "mAP50": score + 0.1},
        "coco": dict.fromkeys(("AP", "AP_small", "AP_medium", "AP_large"), score),
        "scorers_differ_by": 0.0,
        "train_s": 10.0,
        "wall_s": 20.0,
        **kw,
    }


def test_named_runs_and_their_order() -> None:
    """`runs=` names exactly the runs to train; otherwise every path x epochs x seed, longest schedules first."""
    p = harness.ParitySettings(epochs="10,30", seeds="0,1", paths="native,graphs")
    names = [e.name for e in harness.plan(p, cpu=False)]
    assert names[:4] == ["native-e30-s0", "graphs-e30-s0", "native-e30-s1", "graphs-e30-s1"] and len(names) == 8
    named = harness.plan(harness.ParitySettings(runs="throughput-e30-s2,native-e10-s0"), cpu=False)
    assert [(e.path, e.epochs, e.seed, e.batch) for e in named] == [("throughput", 30, 2, 256), ("native", 10, 0, 64)]
    assert "train.lr0=0.04" in named[0].args  # throughput mode's linear LR rule at 256
    assert harness.plan(harness.ParitySettings(runs="none"), cpu=False) == []
    with pytest.raises(ConfigError, match="runs"):
        harness.plan(harness.ParitySettings(runs="graphs-30-s1"), cpu=False)
    with pytest.raises(ConfigError, match="graphs"):
        harness.plan(harness.ParitySettings(runs="graphs-e2-s0"), cpu=True)


def test_a_variant_is_labelled_and_its_overrides_win() -> None:
    """overrides= changes every run of the call (after the benchmark's own settings, so they win) and label= keeps
    those runs apart from the path's own in names and table rows; overrides without a label are refused."""
    p = harness.ParitySettings(
        runs="throughput-e30-s0", overrides="train.optimizer=AdamW train.lr0=0.002", label="adamw"
    )
    (entry,) = harness.plan(p, cpu=False)
    assert entry.name == "throughput.adamw-e30-s0" and entry.variant == "throughput.adamw"
    args = [*entry.args, *harness._overrides(p, entry)]
    assert args[-2:] == ["train.optimizer=AdamW", "train.lr0=0.002"] and "train.lr0=0.04" in args
    assert parse_overrides(args)["train"]["lr0"] == 0.002  # the later value is the one trained with
    with pytest.raises(ConfigError, match="label"):
        harness.plan(harness.ParitySettings(runs="throughput-e30-s0", overrides="train.lr0=0.02"), cpu=False)
    with pytest.raises(ConfigError, match="label"):  # not a plain run name: refused before any data or run
        harness.plan(harness.ParitySettings(runs="throughput-e30-s0", label="lr+2"), cpu=False)


def test_stream_paths_decode_where_they_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """streamworker decodes in the Train worker, streamdevice on its GPU, stream (the default decoder) and streamcpu in
    Ray Data's tasks; each takes the CPUs its decoder's rule gives it (13 and 2 on a 16-CPU host:
    test_auto_cpus_per_worker); all with CUDA graphs on a GPU."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    p = harness.ParitySettings(runs="stream-e4-s0,streamcpu-e4-s0,streamworker-e4-s0,streamdevice-e4-s0")
    got = {}
    for e in harness.plan(p, cpu=False):
        cfg = parse_overrides([*e.args, *harness._overrides(p, e)])
        assert cfg["data"]["loader"] == "stream" and cfg["train"]["cuda_graphs"] is True
        got[e.path] = (cfg["data"].get("stream_decode", "auto"), cfg["scaling"]["cpus_per_worker"])
    assert got == {"stream": ("auto", "auto"), "streamcpu": ("cpu", "auto"), "streamworker": ("worker", "auto"),
                   "streamdevice": ("device", "auto")}  # fmt: skip


def test_runs_at_once_stay_within_the_gpu_memory_budget() -> None:
    """parallel=N runs up to N at once, but never more than the memory budget holds (a 256-image run takes what
    two or three 64-image ones do); a run that ran out of memory beside others runs again, alone."""
    p = harness.ParitySettings(parallel=4, gpu_mem_gib=100)
    runs = "graphs-e10-s0,graphs-e10-s1,throughput-e10-s0,native-e10-s0"
    entries = harness.plan(harness.ParitySettings(runs=runs), cpu=False)
    lock, live, peak, tries, retry_alone = threading.Lock(), [], [], {}, []

    def one(e: harness.Entry) -> dict:
        with lock:
            live.append(e)
            peak.append(sum(harness.expected_gpu_gib(x.batch) for x in live))
            tries[e.name] = tries.get(e.name, 0) + 1
            others = len(live) > 1
            if tries[e.name] == 2:
                retry_alone.append(not others)
        time.sleep(0.3 if e.path == "native" else 0.05)  # the throughput run starts while native still runs
        with lock:
            live.remove(e)
        oom = e.path == "throughput" and tries[e.name] == 1 and others
        return {"name": e.name, "error": "CUDA out of memory"} if oom else {"name": e.name, "error": "stub"}

    done: list[dict] = []
    harness.run_all(p, entries, one, done.append)
    assert sorted(r["name"] for r in done) == sorted(e.name for e in entries)  # each reported once
    assert max(peak) <= 100
    assert tries["throughput-e10-s0"] == 2 and retry_alone == [True]  # it started beside a 64-image run


def test_clocks_count_only_from_runs_that_had_the_machine_alone() -> None:
    rows = [_row("native-e30-s0", 0.70, 0, 10), _row("graphs-e30-s0", 0.69, 10, 20)]
    rows.append(_row("graphs-e30-s1", 0.68, 15, 30))
    harness.mark_contended(rows)
    assert [r["contended"] for r in rows] == [False, True, True]
    summary = {(r["path"], r["epochs"]): r for r in harness.summarize(rows)}
    assert summary[("native", 30)]["timed_seeds"] == [0] and summary[("native", 30)]["wall_s"] == 20.0
    graphs = summary[("graphs", 30)]
    assert graphs["timed_seeds"] == [] and graphs["wall_s"] is None  # both contended: no clock at all
    assert graphs["vs_native_mAP50-95"] == pytest.approx(-0.015) and graphs["at_parity"] is False
    assert graphs["vs_native_paired"]["n"] == 1 and graphs["vs_native_paired"]["mean"] == pytest.approx(-0.01)
    assert graphs["parity_decided"]["verdict"] == "undecided"  # one seed a side: no spread to judge by


def test_throughput_mode_is_also_compared_with_plain_ultralytics_at_its_batch() -> None:
    """`nativethroughput`: plain Ultralytics at throughput mode's batch and lr0, so a large batch's own cost on a
    dataset is told apart from what yolo_ray's path costs; a labelled variant is compared with its own label's."""
    (native, fast) = harness.plan(harness.ParitySettings(runs="nativethroughput-e30-s0,throughput-e30-s0"), cpu=False)
    assert native.args[:3] == ["--native", "--device", "0"] and "train.lr0=0.04" in native.args
    assert native.batch == fast.batch == 256 and "train.lr0=0.04" in fast.args
    (cpu,) = harness.plan(harness.ParitySettings(runs="nativethroughput-e2-s0"), cpu=True)  # on a CPU too
    assert cpu.args[:3] == ["--native", "--device", "cpu"]
    rows = [_row("native-e30-s0", 0.70), _row("native-e30-s1", 0.68)]
    rows += [_row("nativethroughput-e30-s0", 0.55), _row("nativethroughput-e30-s1", 0.57)]
    rows += [_row("throughput-e30-s0", 0.56), _row("throughput-e30-s1", 0.57)]
    summary = {r["path"]: r for r in harness.summarize(rows)}
    fast_row = summary["throughput"]
    assert fast_row["vs_native_mAP50-95"] == pytest.approx(-0.125)  # the bar: native at its own batch
    same = fast_row["vs_same_batch_native"]
    assert same["path"] == "nativethroughput" and same["mAP50-95"] == pytest.approx(0.005)
    assert same["paired"]["n"] == 2 and same["paired"]["mean"] == pytest.approx(0.005)
    assert same["decided"]["verdict"] == "undecided"  # two seeds a side, +0.5 points: the interval is wide
    assert "vs_same_batch_native" not in summary["native"] and "vs_same_batch_native" not in summary["nativethroughput"]
    lr02 = {**_row("throughput-e30-s0", 0.5), "path": "throughput.lr02", "name": "throughput.lr02-e30-s0"}
    labelled = harness.summarize([lr02, _row("nativethroughput-e30-s0", 0.55)])
    assert all("vs_same_batch_native" not in r for r in labelled)  # no nativethroughput.lr02 to compare with
    same_label = {**_row("nativethroughput-e30-s0", 0.45), "path": "nativethroughput.lr02"}
    (row,) = [r for r in harness.summarize([lr02, same_label]) if r["path"] == "throughput.lr02"]
    assert row["vs_same_batch_native"]["path"] == "nativethroughput.lr02"
    assert row["vs_same_batch_native"]["mAP50-95"] == pytest.approx(0.05)


def test_validation_cost_is_also_read_from_the_epoch_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The epoch's end (after the batch loop) over the no-val run's, as a share of its epoch: inline validation's cost
    without the noise of the two runs' training speeds, beside the whole epoch's ratio (the issue's bar)."""
    history = [{"epoch": e, "epoch_time_s": 3.0 + e, "train_time_s": 2.5 + e, "val_s": 0.4} for e in (1, 2, 3, 4)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    clock = harness.epoch_clock(tmp_path)
    assert clock["epoch_s"] == 5.5 and clock["end_of_epoch_s"] == 0.5  # epochs 2..3, the same for both
    no_val = {**_row("graphs-e10-s0", 0.5), "epoch_s": 3.2, "end_of_epoch_s": 0.02}
    inline = {**_row("valinline-e10-s0", 0.5), "epoch_s": 3.6, "end_of_epoch_s": 0.18}  # trained 0.24 s slower
    parity_report.print_epoch_clocks({"results": [no_val, inline]})
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("valinline")]
    assert [c.strip() for c in line.split("|")][1:5] == ["3.600", "+12.5%", "0.18", "+5.0%"]
    # a variant of a validating path (overrides=... label=graphs) is costed as its path is, in its path's place
    variant = {**inline, "name": "valthread.graphs-e10-s0", "path": "valthread.graphs", "epoch_s": 3.3}
    parity_report.print_epoch_clocks({"results": [variant, no_val]})
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith(("graphs", "valthread"))]
    assert [x.split()[0] for x in lines] == ["graphs-e10-s0", "valthread.graphs-e10-s0"]
    assert [c.strip() for c in lines[1].split("|")][1:3] == ["3.300", "+3.1%"]


def test_a_run_of_another_benchmark_call_makes_clocks_contended(tmp_path: Path) -> None:
    """Two `bench --parity` calls at once on one host: each call's runs see the other's through the shared ledger.
    A run still going counts while its process lives; one whose process died without an end line does not."""
    path = tmp_path / "ledger.jsonl"
    ours, theirs = RunLedger(path), RunLedger(path, pid=os.getppid())  # the other call: a process that lives
    ours.started("graphs-e30-s0", 0), ours.ended("graphs-e30-s0", 10)
    theirs.started("native-e30-s0", 5), theirs.ended("native-e30-s0", 8)
    theirs.started("throughput-e30-s0", 20)  # still running
    with subprocess.Popen([sys.executable, "-c", "pass"]) as gone:
        pass
    RunLedger(path, pid=gone.pid).started("device-e30-s0", 30)  # killed: never ended
    with path.open("a") as f:
        f.write('{"pid": 1, "na')  # a line cut short
    assert sorted(ours.others(now=50)) == [(5.0, 8.0), (20.0, 50.0)]
    rows = [
        _row("graphs-e30-s0", 0.69, 0, 10),
        _row("graphs-e30-s1", 0.68, 10, 19),
        _row("graphs-e30-s2", 0.68, 60, 70),
    ]
    harness.mark_contended(rows, ours.others(now=50))
    assert [r["contended"] for r in rows] == [True, False, False]


def test_earlier_results_join_the_table_and_a_rerun_is_compared(tmp_path: Path) -> None:
    """merge=FILE[:paths]: earlier runs count (an older file without contention marks is taken as contended); a run
    named again replaces its earlier row and the report says whether it reproduced the score."""
    old = tmp_path / "old.json"
    rows = [_row("native-e10-s0", 0.47), _row("native-e10-s1", 0.40), _row("device-e10-s0", 0.43)]
    for r in rows:
        r.pop("started"), r.pop("ended")
    old.write_text(json.dumps({"results": rows, "gpu_name": "H"}))
    p = harness.ParitySettings(merge=f"{old}:native")
    earlier = harness.merged_results(p)
    assert [r["name"] for r in earlier] == ["native-e10-s0", "native-e10-s1"]
    assert all(r["contended"] and r["from"] == "old.json" for r in earlier)
    kept, again = harness.combine(earlier, [_row("native-e10-s0", 0.47)])
    assert sorted(r["name"] for r in kept) == ["native-e10-s0", "native-e10-s1"]
    assert again == [{"name": "native-e10-s0", "from": "old.json", "earlier": 0.47, "now": 0.47}]
    filed = tmp_path / "filed.json"  # as kept in benchmarks/results/: the run's JSON under "parity", with its command
    bare = json.loads(old.read_text())
    filed.write_text(json.dumps({"what": "...", "command": "yolo-ray bench --parity", "parity": bare}))
    assert harness.merged_results(harness.ParitySettings(merge=f"{filed}:native")) == [
        {**r, "from": "filed.json"} for r in earlier
    ]
    assert harness.file_header(str(filed))["gpu_name"] == "H"
    with pytest.raises(ConfigError, match="merge"):
        harness.merged_results(harness.ParitySettings(merge=str(tmp_path / "missing.json")))


def test_parity_is_decided_only_where_the_seeds_tell() -> None:
    """Welch's interval of the difference of the means: clear above the bar, clear below it, or a spread that cannot
    tell (then the seeds a side that would); the means alone (at_parity) say yes or no either way."""
    from yolo_ray.bench.parity_report import decide_parity

    native = [0.686, 0.668, 0.705]
    above = decide_parity([0.700, 0.701, 0.699], [0.690, 0.691, 0.689])
    assert above["verdict"] == "met" and above["ci95"][0] >= -0.005
    below = decide_parity([0.556, 0.527, 0.587], native)
    assert below["verdict"] == "missed" and below["ci95"][1] < -0.005
    wide = decide_parity([0.690, 0.640, 0.720], native)  # +0.0003: the means say parity, the spread cannot
    assert wide["verdict"] == "undecided" and wide["ci95"][0] < -0.005 < wide["ci95"][1]
    assert 10 < wide["seeds_a_side"] < 10_000
    closer = decide_parity([0.730, 0.680, 0.760], native)  # the same spread, 4 points further from the bar
    assert closer["seeds_a_side"] < wide["seeds_a_side"]
    assert decide_parity([0.7], native) == {"ci95": None, "verdict": "undecided", "seeds_a_side": None}

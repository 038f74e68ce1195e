"""The parity benchmark's results: runs that shared the machine marked, per path the mean and spread over seeds and
the difference from native's (paired seed by seed), earlier result files merged in, and the printed tables."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from yolo_ray.bench.parity_paths import PARITY_POINTS, PATHS, SAME_BATCH_NATIVE, VALIDATING
from yolo_ray.config import ConfigError


def mark_contended(results: list[dict[str, Any]], others: Sequence[tuple[float, float]] = ()) -> None:
    """A run whose time overlapped another's has contended clocks: its accuracy counts, its times do not. `others`:
    (started, ended) of runs outside `results`, e.g. another benchmark call's on this host (run_ledger.py)."""
    for r in results:
        if "started" in r:
            spans = [(o["started"], o["ended"]) for o in results if o is not r and "started" in o] + list(others)
            r["contended"] = any(start < r["ended"] and r["started"] < end for start, end in spans)


def _base_path(path: str) -> str:
    """The path a labelled variant varies (`valthread.graphs` -> `valthread`); a path is its own."""
    return path.partition(".")[0]


def _order(path: str) -> int:
    base = _base_path(path)  # a labelled variant beside its path
    return PATHS.index(base) if base in PATHS else len(PATHS)


def _spread(values: list[float | None]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "mean": round(statistics.mean(values), 5),
        "std": round(statistics.stdev(values), 5) if len(values) > 1 else 0.0,
        "min": round(min(values), 5),
        "max": round(max(values), 5),
    }


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (path, epochs): mean and spread over seeds of each score, and the difference from native's mean."""
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        if "error" not in r:
            groups.setdefault((r["path"], r["epochs"]), []).append(r)
    for (path, epochs), runs in sorted(groups.items(), key=lambda g: (g[0][1], _order(g[0][0]))):
        runs.sort(key=lambda r: r["seed"])
        row: dict[str, Any] = {"path": path, "epochs": epochs, "seeds": [r["seed"] for r in runs]}
        row["by_seed"] = {r["seed"]: r["ultralytics"]["mAP50-95"] for r in runs}
        row["mAP50-95"] = _spread([r["ultralytics"]["mAP50-95"] for r in runs])
        row["mAP50"] = _spread([r["ultralytics"]["mAP50"] for r in runs])
        for key in ("AP", "AP_small", "AP_medium", "AP_large"):
            row[f"coco_{key}"] = _spread([r["coco"][key] for r in runs])
        row["scorers_differ_by_max"] = max(r["scorers_differ_by"] for r in runs)
        alone = [r for r in runs if not r.get("contended")]  # clocks only from runs that had the machine
        row["timed_seeds"] = [r["seed"] for r in alone]
        for key in ("train_s", "wall_s", "startup_s", "loop_s", "end_s", "loop_images_per_s"):
            values = [r[key] for r in alone if r.get(key) is not None]
            row[key] = round(statistics.mean(values), 2) if values else None
        rows.append(row)
    for row in rows:
        native = next((n for n in rows if n["path"] == "native" and n["epochs"] == row["epochs"]), None)
        if native and row["path"] != "native":
            vs = _compared(row, native)
            row["vs_native_mAP50-95"] = vs["mAP50-95"]
            row["at_parity"] = row["mAP50-95"]["mean"] - native["mAP50-95"]["mean"] >= -PARITY_POINTS
            row["parity_decided"], row["vs_native_paired"] = vs["decided"], vs["paired"]
            if row["train_s"] and native["train_s"]:
                row["train_speedup"] = round(native["train_s"] / row["train_s"], 2)
            if row["wall_s"] and native["wall_s"]:
                row["wall_speedup"] = round(native["wall_s"] / row["wall_s"], 2)
        same = _same_batch_native(row, rows)
        if same:
            row["vs_same_batch_native"] = _compared(row, same)
    return rows


def _same_batch_native(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Plain Ultralytics at the row's own batch and LR rule (`throughput.lr02` -> `nativethroughput.lr02`)."""
    base, dot, label = row["path"].partition(".")
    if base not in SAME_BATCH_NATIVE:
        return None
    name = SAME_BATCH_NATIVE[base] + dot + label
    return next((n for n in rows if n["path"] == name and n["epochs"] == row["epochs"]), None)


def _compared(row: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """The row's mean mAP50-95 against `ref`'s: the difference, paired seed by seed (a seed fixes the initial weights
    on both sides: the spread of the difference itself), and what the seeds decide."""
    paired = [v - ref["by_seed"][k] for k, v in row["by_seed"].items() if k in ref["by_seed"]]
    return {
        "path": ref["path"],
        "mAP50-95": round(row["mAP50-95"]["mean"] - ref["mAP50-95"]["mean"], 5),
        "paired": {**(_spread(paired) or {}), "n": len(paired)},
        "decided": decide_parity(list(row["by_seed"].values()), list(ref["by_seed"].values())),
    }


def decide_parity(path: list[float], native: list[float], bar: float = PARITY_POINTS) -> dict[str, Any]:
    """Whether the seeds tell that path's mean mAP50-95 is at least native's - bar: Welch's 95% interval of the
    difference of the means, `met` when all of it clears the bar, `missed` when none does, else `undecided`; and the
    seeds a side (the same spreads assumed) that would tell, at the difference seen. at_parity compares the means
    alone; with native's spread at 10 epochs (sd 0.04) that comparison is a coin toss at a few seeds."""
    import numpy as np
    from scipy import stats

    diff = statistics.mean(path) - statistics.mean(native)
    if min(len(path), len(native)) < 2:
        return {"ci95": None, "verdict": "undecided", "seeds_a_side": None}
    va, vb = statistics.variance(path), statistics.variance(native)
    sa, sb = va / len(path), vb / len(native)
    df = (sa + sb) ** 2 / (sa**2 / (len(path) - 1) + sb**2 / (len(native) - 1)) if sa + sb else 1e9
    half = float(stats.t.ppf(0.975, df)) * (sa + sb) ** 0.5
    lo, hi = diff - half, diff + half
    verdict = "met" if lo >= -bar else "missed" if hi < -bar else "undecided"
    n = np.arange(2, 10_001)
    tells = np.flatnonzero(stats.t.ppf(0.975, 2 * n - 2) * np.sqrt((va + vb) / n) < abs(diff + bar))
    seeds = int(n[tells[0]]) if tells.size else None
    return {"ci95": [round(lo, 5), round(hi, 5)], "verdict": verdict, "seeds_a_side": seeds}


def merged_results(p: Any) -> list[dict[str, Any]]:
    """The runs of earlier result files (`merge=`), each tagged with its file; a name seen twice keeps the first."""
    out: dict[str, dict[str, Any]] = {}
    for item in p.listed("merge"):
        f, _, only = item.partition(":")
        try:
            rows = bench_file(f)["results"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError("yolo-ray bench --parity", "merge", f"cannot read results from {f} ({e}).",
                              "pass result JSONs this benchmark wrote.") from None  # fmt: skip
        for r in rows:
            if only and r["path"] not in only.split("+"):
                continue
            # a file that did not record contention (older ones) is taken as contended: its clocks are not used
            out.setdefault(r["name"], {"contended": True, **r, "from": r.get("from", Path(f).name)})
    return list(out.values())


def bench_file(f: str) -> dict[str, Any]:
    """A file this benchmark wrote, bare or as filed in benchmarks/results/ (under "parity", with its command)."""
    d = json.loads(Path(f).read_text())
    return d.get("parity", d)


def file_header(f: str) -> dict[str, Any]:
    """Where an earlier file's runs were measured."""
    d = bench_file(f)
    return {"file": Path(f).name, **{k: d.get(k) for k in ("gpu_name", "machine", "commit", "date")}}


def combine(earlier: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """(every run, with a fresh run replacing an earlier one of its name; the replaced ones with both scores): a
    re-run of a deterministic run must reproduce its score to every digit."""
    names = {r["name"]: r for r in fresh if "error" not in r}
    kept = [r for r in earlier if r["name"] not in names]
    again = [
        {"name": r["name"], "from": r["from"], "earlier": _score(r), "now": _score(names[r["name"]])}
        for r in earlier
        if r["name"] in names
    ]
    return [*kept, *fresh], again


def _score(r: dict[str, Any]) -> float | None:
    return r["ultralytics"]["mAP50-95"] if "ultralytics" in r else None


def _devices(report: dict[str, Any]) -> str:
    """The devices this table's runs trained on: this call's and the merged files'."""
    names = {report["gpu_name"], *(h.get("gpu_name") for h in report.get("merged_from", []))}
    return ", ".join(sorted({n or "CPU" for n in names}))


def print_table(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(
        f"\nparity on real-shaped data: {s['model']} @ {s['imgsz']} px, {s['images']} train images, "
        f"{_devices(report)}; scores mean±sd over seeds; clocks (s) from runs that had the machine alone"
    )
    cols = ["path", "epochs", "seeds", "mAP50-95", "vs native", "paired", "decided", "mAP50", "coco AP", "AP_small"]
    cols += ["AP_medium"]
    cols += ["AP_large", "train_s", "startup_s", "wall_s", "timed seeds", "scorers differ"]
    print(" | ".join(c.ljust(13) for c in cols))

    def ms(d: dict[str, float] | None) -> str:
        return f"{d['mean']:.4f}±{d['std']:.4f}" if d else "-"

    for r in report.get("summary", []):
        scores = [
            ms(r[k]) for k in ("mAP50-95", "mAP50", "coco_AP", "coco_AP_small", "coco_AP_medium", "coco_AP_large")
        ]
        seeds = ",".join(map(str, r["seeds"]))
        paired = r.get("vs_native_paired") or {}
        pair = f"{paired['mean']:+.4f}±{paired['std']:.4f}" if paired.get("n") else "-"
        cells = [r["path"], str(r["epochs"]), seeds, scores[0], f"{r.get('vs_native_mAP50-95', 0):+.4f}", pair]
        cells.append(_decided_cell(r.get("parity_decided")))
        cells += scores[1:]
        cells += [str(r[k]) for k in ("train_s", "startup_s", "wall_s")]
        cells += [",".join(map(str, r.get("timed_seeds", []))) or "-", f"{r['scorers_differ_by_max']:.5f}"]
        print(" | ".join(c.ljust(13) for c in cells))
    for r in report.get("summary", []):
        same = r.get("vs_same_batch_native")
        if same:
            paired = same["paired"]
            pair = f", paired {paired['mean']:+.4f}±{paired['std']:.4f}" if paired.get("n") else ""
            print(
                f"{r['path']} ({r['epochs']} epochs) vs {same['path']}, plain Ultralytics at its batch and lr0: "
                f"{same['mAP50-95']:+.4f}{pair}, {_decided_cell(same['decided'])}"
            )
    print_epoch_clocks(report)


def _decided_cell(d: dict[str, Any] | None) -> str:
    """met / missed, or undecided with the seeds a side that would tell ("-" for native itself)."""
    if not d:
        return "-"
    return d["verdict"] if d["verdict"] != "undecided" else f"? {d['seeds_a_side'] or '-'} seeds"


def _end_share(run: dict[str, Any], ref: dict[str, Any] | None) -> str:
    """How much longer the run's epoch end is than the no-val run's, as a share of the no-val epoch."""
    end, ref_end = run.get("end_of_epoch_s"), ref.get("end_of_epoch_s") if ref else None
    return f"{(end - ref_end) / ref['epoch_s']:+.1%}" if ref and end is not None and ref_end is not None else "-"


def print_epoch_clocks(report: dict[str, Any]) -> None:
    """Per run: the training process's mean epoch, validation's seconds and lag, the best epoch, and validation's cost
    against the same path validating only at the end (`graphs`, or `device` on CPUs; same epochs and seed) two ways:
    the mean epoch over that run's (vs no val: the bar, but it moves with the two runs' training speeds, which differ
    by several % on a shared host), and the epoch's end over that run's, as a share of that run's epoch (end vs no val:
    inline validation's cost without that noise; with val_async it leaves out training slowed by the validator)."""
    runs = [r for r in report.get("results", []) if r.get("epoch_s") is not None and "error" not in r]
    if not any(_base_path(r["path"]) in VALIDATING for r in runs):
        return
    base = {
        (r["epochs"], r["seed"]): r
        for r in runs
        if r["path"] in ("graphs", "device") and not r.get("contended")  # graphs on a GPU, device on CPUs
    }
    print("\nepoch clocks (s; epochs 2..n-1; alone on the machine unless marked): validation's cost per epoch")
    cols = ["run", "epoch_s", "vs no val", "end_s", "end vs no val", "val_s", "val lag max", "best epoch", "mAP50-95"]
    print(" | ".join(c.ljust(13) for c in [*cols, "wall_s"]))
    for r in sorted(runs, key=lambda r: (r["epochs"], r["seed"], _order(r["path"]))):
        ref = None if r.get("contended") else base.get((r["epochs"], r["seed"]))
        share = f"{r['epoch_s'] / ref['epoch_s'] - 1:+.1%}" if ref else "-"
        cells = [r["name"] + (" (contended)" if r.get("contended") else ""), f"{r['epoch_s']:.3f}", share]
        cells += [str(r.get("end_of_epoch_s")), _end_share(r, ref), str(r.get("val_s")), str(r.get("val_lag_max"))]
        cells += [str(r.get("best_epoch")), f"{r['ultralytics']['mAP50-95']:.5f}", str(r.get("wall_s"))]
        print(" | ".join(c.ljust(13) for c in cells))
    for r in report.get("reproduced", []):
        same = "the same" if r["earlier"] == r["now"] else "NOT the same"
        print(f"re-run {r['name']}: mAP50-95 {r['now']} now, {r['earlier']} in {r['from']}: {same}")
    for r in report["results"]:
        if "error" in r:
            print(f"ERROR {r['name']}: {r['error'][-400:]}")

"""A real 2-worker Ray Train run (gloo, CPU): DDP is real, the model learns, and it matches plain Ultralytics."""

from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from conftest import ENV, LEARN_EPOCHS, REPO, STAGING_PREFIX, SharedRay, read_jsonl, small_run, smoke_run, yolo_ray


def _ranks(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank*.json"))]


def test_two_scorers_agree_on_trained_weights(ddp_run: Path, shapes: Path, tmp_path: Path) -> None:
    """The parity benchmark's independent scorer: pycocotools' COCOeval on ground truth built from the label files
    agrees with Ultralytics' validator on a model that learned (COCO's AP by size reported beside it)."""
    from yolo_ray.bench import coco_eval

    scores = coco_eval.score(ddp_run / "train" / "weights" / "best.pt", shapes / "data.yaml", 128, "cpu", tmp_path)
    own, coco = scores["ultralytics"], scores["coco"]
    assert own["mAP50-95"] > 0.3, scores
    assert coco["AP"] == pytest.approx(own["mAP50-95"], abs=0.01), scores
    assert coco["AP50"] == pytest.approx(own["mAP50"], abs=0.01), scores
    # 128 px shapes are small and medium objects (COCO's large starts at 96^2 px): AP_large has no objects to score
    assert coco["AP_small"] is not None and coco["AP_medium"] is not None and coco["AP_large"] is None


# What a run prints besides its epoch lines (no TTY): where MLflow and Ray are, the export, the registration, done.
OTHER_LINES = ("[yolo_ray] mlflow: run ", "[yolo_ray] ray: ", "[yolo_ray] training starts ", "[yolo_ray] exported ",
               "[yolo_ray] mlflow: registered ")  # fmt: skip
CHATTER = ("Ultralytics 8", "Started a local Ray", "TrainController", "Reporting training result", "Epoch    GPU_mem")


def test_the_terminal_shows_one_line_per_epoch(ddp_run: Path) -> None:
    """What the user reads without a terminal (CI, `ray job submit` logs): one line per epoch, printed once (Ray
    Train's print patch printed every worker `print` twice), a few lines around them, and none of Ray's or
    Ultralytics' start-up chatter, model tables or per-batch bars (run.verbose shows those)."""
    (log,) = [p for p in ddp_run.parent.glob("cli-*.log") if "[yolo_ray] epoch 1/" in p.read_text()]
    lines = log.read_text().splitlines()
    epochs = [ln for ln in lines if ln.startswith("[yolo_ray] epoch ")]
    assert [ln.split()[2] for ln in epochs] == [f"{e}/{LEARN_EPOCHS}" for e in range(1, LEARN_EPOCHS + 1)]
    others = [ln for ln in lines if ln not in epochs]
    assert [sum(ln.startswith(o) for ln in others) for o in OTHER_LINES] == [1] * len(OTHER_LINES), others
    assert others[-1].startswith("[yolo_ray] done: mAP50=") and len(others) == len(OTHER_LINES) + 1, others
    assert not [ln for ln in lines if any(c in ln for c in CHATTER)]


def test_a_finished_run_rerun_with_other_settings_is_refused(ddp_run: Path, shapes: Path) -> None:
    """Re-running a finished run: the same settings say so and exit 0; other settings (dotted or in Ultralytics'
    words) exit 2 naming each changed key with its old and new value, before Ray starts, and the run is untouched."""
    before = (ddp_run / "summary.json").read_text()
    same = [str(REPO / "experiments" / "smoke.yaml"), f"data.dir={shapes}", f"train.epochs={LEARN_EPOCHS}"]
    same += [f"run.storage_path={ddp_run.parent}", "run.name=learn", "tracking.enabled=false"]
    again = yolo_ray("train", *same, cwd=ddp_run.parent)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stdout[-2000:]
    changed = yolo_ray("train", *same, "train.lr0=0.02", "mosaic=0.5", cwd=ddp_run.parent)
    assert changed.returncode == 2 and "Traceback" not in changed.stdout, changed.stdout[-2000:]
    text = " ".join(changed.stdout.split())
    assert "train.lr0: 0.01 -> 0.02" in text and "train.extra.mosaic: None -> 0.5" in text and "new run.name" in text
    assert "[yolo_ray] ray:" not in changed.stdout  # refused before Ray started
    assert (ddp_run / "summary.json").read_text() == before


def test_ddp_is_real(ddp_run: Path) -> None:
    ranks = _ranks(ddp_run)
    assert [r["world_rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["env"]["WORLD_SIZE"] == "2" for r in ranks)
    assert all(r["backend"] == "gloo" for r in ranks)
    # One optimizer, one model: after every epoch of DDP the parameters are bit-identical on both ranks.
    assert ranks[0]["param_sha256"] == ranks[1]["param_sha256"]
    # Each rank trained on its own half of the data.
    shard0, shard1 = (set(r["shard_indices_epoch0"]) for r in ranks)
    assert shard0 and shard1 and not shard0 & shard1
    assert len(shard0 | shard1) == 384
    # smoke.yaml: global batch 16 -> 8 per worker, explicit accumulate 1 (an optimizer step every batch).
    assert [r["per_worker_batch"] for r in ranks] == [8, 8]
    assert [r["accumulate"] for r in ranks] == [1, 1]


def _trained_and_learned(run_dir: Path, epochs: int, window: int = 5) -> list[dict]:
    """Every epoch ran once, in order, and mAP50 rose by more than 0.3 from the first `window` epochs to the last;
    returns the run's history."""
    history = read_jsonl(run_dir / "history.jsonl")
    assert [h["epoch"] for h in history] == list(range(1, epochs + 1))
    curve = [round(h["mAP50"], 3) for h in history]
    assert max(curve[-window:]) > max(curve[:window]) + 0.3, curve
    return history


def test_it_learns(ddp_run: Path) -> None:
    history = _trained_and_learned(ddp_run, LEARN_EPOCHS)
    summary = json.loads((ddp_run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["epochs_completed"] == LEARN_EPOCHS
    assert summary["world_size"] == 2 and summary["nodes"] == 1
    assert summary["final"]["mAP50"] >= 0.5, summary
    assert history[-1]["train/box_loss"] < history[0]["train/box_loss"]
    # every optimizer step's gradient norm, before Ultralytics' clip at 10.0 (384 images, 16 a step: 24 steps)
    assert all(h["grad_norm_steps"] == 24 and 0 <= h["grad_clipped_share"] <= 1 for h in history), history
    assert all(0 < h["grad_norm_mean"] <= h["grad_norm_max"] < math.inf for h in history)
    # every epoch validated, and says what that cost: in all, and Ultralytics' per-image phases within it
    assert all(0 < h["val_ms_per_image/inference"] * 1e-3 < h["val_s"] < h["epoch_time_s"] for h in history)
    assert Path(summary["best_weights"]).is_file() and Path(summary["checkpoint"], "last.pt").is_file()
    # the kept epoch checkpoints are copies of last.pt as it was, not links to the file Ultralytics rewrites
    kept = [c / "last.pt" for c in sorted(ddp_run.glob("checkpoint_*")) if c.is_dir()]
    assert len(kept) == 2 and all(p.stat().st_nlink == 1 for p in kept)
    assert kept[0].read_bytes() != kept[1].read_bytes()
    assert not list((ddp_run / "train" / "weights").glob(f"{STAGING_PREFIX}*"))  # staging directories removed
    assert summary["throughput_images_per_s"] > 0


# Tolerance: both runs see the same data, epochs, global batch (16), accumulation and LR schedule. They differ in
# what DDP on CPU cannot share: BatchNorm statistics come from each rank's 8 images instead of 16 (sync-BN is
# NCCL-only) and the random streams (per-rank seeds, sharded augmentation order) differ. Measured on this 2-core
# machine (mAP50-95, 76 val images): native 0.397 vs yolo_ray 0.454 after 12 epochs (the test's LEARN_EPOCHS),
# 0.499 vs 0.553 after 14, 0.597 vs 0.704 after 20, 0.773 vs 0.701 after 30; on one H200, 1 worker vs native, the
# two agree to five decimals (benchmarks/results). The claim checked is the "no worse than native": more than
# 0.12 below it fails a run that learns markedly worse, while tolerating the per-rank BN effect and run-to-run spread
# (that ranks train one model is test_ddp_is_real's job).
PARITY_TOLERANCE = 0.12


def test_parity_with_plain_ultralytics(ddp_run: Path, shapes: Path, tmp_path: Path) -> None:
    run_dir, _ = smoke_run(tmp_path, shapes, "native", flags=("--native",))
    native = json.loads((run_dir / "summary.json").read_text())["final"]
    timed = read_jsonl(run_dir / "native_epochs.jsonl")  # epochs timed in plain Ultralytics too
    assert [t["epoch"] for t in timed] == list(range(1, LEARN_EPOCHS + 1))
    assert all(t["train_s"] > 0 and t["end_s"] > 0 for t in timed)
    ours = json.loads((ddp_run / "summary.json").read_text())["final"]
    print(f"mAP50-95 native {native['mAP50-95']:.4f} vs yolo_ray {ours['mAP50-95']:.4f}")
    assert native["mAP50-95"] > 0.2, "the baseline itself must have learned for the comparison to mean anything"
    assert ours["mAP50-95"] >= native["mAP50-95"] - PARITY_TOLERANCE


def test_device_loader_learns_like_ultralytics_loader(ddp_run: Path, device_run: Path) -> None:
    """data.loader=device (decode once, batched augmentation on the training device) trains the same experiment
    as well as Ultralytics' own loader does: same epochs, workers, batch and schedule (measured on this machine,
    mAP50-95: 0.536 vs 0.454 after 12 epochs, 0.527 vs 0.553 after 14, 0.679 vs 0.704 after 20, 0.789 vs 0.698
    after 30)."""
    run_dir = device_run
    assert [r["cached_images"] for r in _ranks(run_dir)] == [384, 384]  # auto: a full copy fits
    cache_gib = 384 * 128 * 128 * 3 / 2**30  # each epoch's data_device_peak_gib: the whole cache (and its labels)
    assert all(cache_gib <= h["data_device_peak_gib"] <= 1.1 * cache_gib for h in read_jsonl(run_dir / "history.jsonl"))
    _trained_and_learned(run_dir, LEARN_EPOCHS)
    ours = json.loads((run_dir / "summary.json").read_text())["final"]
    baseline = json.loads((ddp_run / "summary.json").read_text())["final"]
    print(f"mAP50-95 device loader {ours['mAP50-95']:.4f} vs Ultralytics loader {baseline['mAP50-95']:.4f}")
    assert ours["mAP50"] >= 0.5
    assert ours["mAP50-95"] >= baseline["mAP50-95"] - PARITY_TOLERANCE


# The sharded run checks mechanics on the small dataset: what it adds to the device loader is only which images each
# rank draws and holds, and tests/data/test_device_loader.py checks those shards and that a rank's rows equal the
# replicated cache's, so the learning the replicated run shows above carries over. Learning itself, measured here at
# 20 epochs, mAP50-95: sharded 0.693-0.756, replicated 0.690, Ultralytics' loader 0.704; and on 2 x H200 after 5
# epochs of 12288 images: sharded 0.99343, replicated 0.99353 (README, "Two GPUs ...").
SHARDED_EPOCHS = 3


@pytest.fixture(scope="module")
def sharded_tty_run(shapes_small: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A 2-worker device-loader run with a sharded cache, its output on a pseudo-terminal as a user at a shell sees
    it; (run directory, what the terminal received)."""
    tmp_path = tmp_path_factory.mktemp("sharded")
    args = small_run(shapes_small, tmp_path, "sharded", "data.loader=device", "data.device_cache=sharded")
    rc, out = run_in_pty(["train", *args, f"train.epochs={SHARDED_EPOCHS}"], cwd=tmp_path)
    assert rc == 0, out[-5000:]
    return tmp_path / "sharded", out


def test_sharded_device_cache_trains_one_model(sharded_tty_run: tuple[Path, str]) -> None:
    """data.device_cache=sharded: each of the 2 workers decodes and holds only its half of the images (what lets N
    GPUs cache N times the data), draws its batches from that half only, and the two still train one model."""
    run_dir, _ = sharded_tty_run
    ranks = _ranks(run_dir)
    assert [r["cached_images"] for r in ranks] == [48, 48]
    shard0, shard1 = (set(r["shard_indices_epoch0"]) for r in ranks)
    assert not shard0 & shard1 and len(shard0 | shard1) == 96
    assert ranks[0]["param_sha256"] == ranks[1]["param_sha256"]
    history = read_jsonl(run_dir / "history.jsonl")
    assert [h["epoch"] for h in history] == list(range(1, SHARDED_EPOCHS + 1))
    assert all(math.isfinite(h["train/box_loss"]) for h in history)


def test_a_terminal_gets_a_progress_bar(sharded_tty_run: tuple[Path, str]) -> None:
    """On a terminal the driver draws one bar for the epoch in flight (from rank 0's progress.json) and prints
    the epoch lines above it, each once; Ray's and Ultralytics' chatter stays out here too."""
    run_dir, out = sharded_tty_run
    assert re.search(r"\repoch 1/3: +\d+%\|", out), out[-3000:]  # tqdm redrawing in place
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out)  # the bar's cursor moves
    lines = [ln.split("\r")[-1].strip() for ln in text.splitlines()]
    epochs = [ln for ln in lines if ln.startswith("[yolo_ray] epoch ")]
    assert [ln.split()[2] for ln in epochs] == [f"{e}/{SHARDED_EPOCHS}" for e in range(1, SHARDED_EPOCHS + 1)]
    shown = [ln for ln in lines if ln and not re.match(r"epoch \d+/\d+:", ln)]  # all but the bar's last state
    assert all(ln.startswith("[yolo_ray] ") for ln in shown), shown  # no worker warnings, no chatter
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["epoch"] == SHARDED_EPOCHS and progress["batch"] == progress["batches"] > 0


def run_in_pty(args: list[str], cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """`python -m yolo_ray ARGS` with its stdin, stdout and stderr on a pseudo-terminal; (exit code, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a window: 40 rows, 160 columns
    proc = subprocess.Popen(
        [sys.executable, "-m", "yolo_ray", *args], cwd=cwd, env=ENV, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    out, deadline = bytearray(), time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        try:
            data = os.read(master, 65536) if ready else b""
        except OSError:  # EIO: every process holding the terminal has closed it
            break
        if ready and not data:
            break
        out += data
    os.close(master)
    return proc.wait(60), out.decode(errors="replace")


def test_a_dataset_with_relative_paths_trains(shapes_small: Path, tmp_path: Path, shared_ray: SharedRay) -> None:
    """A data.yaml with `path: .`, a train list of lines relative to the working directory and a symlinked nested
    val folder passed `yolo-ray check` and failed in the workers (which run in Ray's session directory): the driver
    resolves them as Ultralytics would from the user's directory, and the run trains."""
    root = tmp_path / "project"
    shutil.copytree(shapes_small / "train", root / "data" / "train")
    (root / "val" / "images").mkdir(parents=True)
    (root / "val" / "labels").mkdir()
    for kind in ("images", "labels"):
        (root / "val" / kind / "nested").symlink_to(shapes_small / "val" / kind, target_is_directory=True)
    images = sorted((root / "data" / "train" / "images").glob("*.jpg"))
    (root / "train.txt").write_text("".join(f"data/train/images/{p.name}\n" for p in images))
    (root / "data.yaml").write_text("path: .\ntrain: train.txt\nval: val/images\nnames: [circle, square, triangle]\n")
    args = small_run(shapes_small, tmp_path, "relative", "train.epochs=1")
    args = [a for a in args if not a.startswith("data.")] + ["data.path=data.yaml"]
    proc = yolo_ray("train", *args, cwd=root, env=shared_ray.env())
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert [h["epoch"] for h in read_jsonl(tmp_path / "relative" / "history.jsonl")] == [1]
    ranks = _ranks(tmp_path / "relative")
    assert sorted(i for r in ranks for i in r["shard_indices_epoch0"]) == list(range(len(images)))

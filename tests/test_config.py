"""Bad input fails early and clearly: file, key and fix in one paragraph, exit code 2, no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO, SharedRay, small_data, yolo_ray

from yolo_ray import config
from yolo_ray.config import ConfigError


def test_overrides_parse_as_yaml_scalars() -> None:
    tree = config.parse_overrides(["train.epochs=5", "train.lr0=1e-3", "scaling.use_gpu=false", "run.name=abc"])
    assert tree == {"train": {"epochs": 5, "lr0": 0.001}, "scaling": {"use_gpu": False}, "run": {"name": "abc"}}


def test_embedded_default_and_overrides() -> None:
    cfg = config.load(None, ["train.epochs=3", "train.extra.mosaic=0.5"])
    assert cfg.source == config.EMBEDDED and cfg.train.epochs == 3 and cfg.train.extra == {"mosaic": 0.5}
    assert cfg.data.path == "synthetic" and cfg.scaling.num_workers == "auto"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "experiments").glob("*.yaml")))
def test_shipped_experiments_validate(name: str) -> None:
    cfg = config.load(REPO / "experiments" / name)
    assert cfg.run.name


def test_coco_recipe_is_the_4gpu_recipe() -> None:
    cfg = config.load(REPO / "experiments" / "seed-coco-4gpu.yaml")
    assert (cfg.model, cfg.train.imgsz, cfg.train.batch, cfg.train.epochs) == ("yolo11s.yaml", 640, 64, 100)
    assert cfg.scaling.num_workers == 4 and cfg.train.workers * 4 == 16
    assert cfg.train.sync_bn and cfg.train.amp and cfg.scaling.use_gpu is True
    acc2 = config.load(REPO / "experiments" / "seed-coco-4gpu-accumulate2.yaml")
    assert acc2.train.accumulate == 2 and acc2.train.batch == 64


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["train.epoch=3"], "train.epoch", "did you mean `train.epochs`"),
        (["train.epochs=many"], "train.epochs", "expected int"),
        (["train.batch=33", "scaling.num_workers=2"], "train.batch", "multiple of 2"),
        (["train.accumulate=0"], "train.accumulate", "must be >= 1"),
        (["train.imgsz=100"], "train.imgsz", "multiple of 32"),
        (["train.grad_clip=-1"], "train.grad_clip", "norm >= 0"),
        (["train.extra.mosiac=0.5"], "train.extra.mosiac", "mosaic"),
        (["scaling.placement_strategy=EVERYWHERE"], "scaling.placement_strategy", "STRICT_SPREAD"),
        (["scaling.cpus_per_worker=0"], "scaling.cpus_per_worker", "must be > 0"),
        (["tune.trial.cpus_per_worker=-1"], "tune.trial.cpus_per_worker", "must be > 0"),
        (["tune.trial.cpus_per_worker=many"], "tune.trial.cpus_per_worker", "auto"),
        (["data.loader=device", "train.extra.mixup=0.2"], "train.extra.mixup", "data.loader: ultralytics"),
        (["data.loader=device", "train.extra.multi_scale=0.5"], "train.extra.multi_scale", "image shapes"),
        (["data.loader=gpu"], "data.loader", "'device'"),
        (["data.device_cache=sharded"], "data.device_cache", "data.loader: device"),
        (["data.loader=device", "data.device_cache=split"], "data.device_cache", "'sharded'"),
        (["train.sync_bn=true", "scaling.use_gpu=false"], "train.sync_bn", "needs GPUs"),
        (["train.cuda_graphs=true", "scaling.use_gpu=false"], "train.cuda_graphs", "needs GPUs"),
        (["train.cuda_graphs=true", "train.sync_bn=true"], "train.cuda_graphs", "SyncBatchNorm"),
        (["train.cuda_graphs=true", "train.extra.compile=true"], "train.cuda_graphs", "drop one"),
        (["train.cuda_graphs=true", "train.extra.freeze=10"], "train.cuda_graphs", "freeze"),
        (["train.val_cuda_graphs=true", "scaling.use_gpu=false"], "train.val_cuda_graphs", "needs GPUs"),
        (
            ["train.val_cuda_graphs=true", "train.val_async=true", "train.val_runner=actor"],
            "train.val_cuda_graphs",
            "actor has none",
        ),
        (["train.val_async=true", "train.val=false"], "train.val_async", "train.val: true"),
        (["train.val_async=true", "train.val_gpus=0.25"], "train.val_gpus", "train.val_runner: actor"),
        (
            ["train.val_async=true", "train.val_runner=actor", "train.val_gpus=0.25", "scaling.use_gpu=false"],
            "train.val_gpus",
            "on CPUs",
        ),
        (["run.fail_val_at_epoch=2"], "run.fail_val_at_epoch", "train.val_async"),
    ],
)
def test_static_errors_name_key_and_fix(overrides: list[str], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.load(None, overrides)
    assert err.value.key == key and words in str(err.value) and "Fix:" in str(err.value)


def _assert_clean_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    assert "error:" in proc.stdout and "Fix:" in proc.stdout
    for f in fragments:
        assert f in proc.stdout.replace("\n  ", " "), proc.stdout


def test_cli_bad_yaml_file_names_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: yolo11n.yaml\ntrian:\n  epochs: 3\n")
    _assert_clean_error(yolo_ray("train", str(bad), cwd=tmp_path), str(bad), "trian", "did you mean `train`")


def test_cli_native_refuses_a_clip_it_cannot_apply(tmp_path: Path) -> None:
    """Ultralytics' own trainer clips at a fixed 10.0: --native with another train.grad_clip exits 2, untrained."""
    proc = yolo_ray("train", "--native", "train.grad_clip=40", cwd=tmp_path)
    _assert_clean_error(proc, "train.grad_clip", "always clips at 10.0", "without --native")
    assert not (tmp_path / "runs").exists()


def test_cli_missing_dataset(tmp_path: Path) -> None:
    _assert_clean_error(
        yolo_ray("train", "data.path=/nonexistent/data.yaml", cwd=tmp_path),
        "data.path",
        "/nonexistent/data.yaml",
        "does not exist",
    )


def test_cli_missing_image_folder(shapes_small: Path, tmp_path: Path) -> None:
    data = shapes_small / "data.yaml"
    broken = tmp_path / "data.yaml"
    broken.write_text(data.read_text().replace("val: val/images", "val: val/nowhere"))
    _assert_clean_error(yolo_ray("train", f"data.path={broken}", cwd=tmp_path), "val images are missing", "nowhere")


def test_cli_label_class_out_of_range(shapes_small: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(shapes_small, copy)
    label = sorted((copy / "train" / "labels").glob("*.txt"))[5]
    label.write_text(label.read_text() + "7 0.5 0.5 0.1 0.1\n")
    (copy / "data.yaml").write_text((copy / "data.yaml").read_text().replace(str(shapes_small), str(copy)))
    _assert_clean_error(
        yolo_ray("train", f"data.path={copy / 'data.yaml'}", cwd=tmp_path), label.name, "class id 7", "nc=3"
    )


def test_cli_missing_weights(tmp_path: Path) -> None:
    _assert_clean_error(yolo_ray("train", "model=/nonexistent/best.pt", cwd=tmp_path), "model", "nothing is downloaded")


def test_cli_more_workers_than_the_cluster_can_give(shapes_small: Path, tmp_path: Path, shared_ray: SharedRay) -> None:
    proc = yolo_ray(
        "train",
        *small_data(shapes_small),
        "scaling.num_workers=64",
        "train.batch=64",
        f"run.storage_path={tmp_path}",
        cwd=tmp_path,
        env=shared_ray.env(),
    )
    _assert_clean_error(proc, "scaling.num_workers", "64 workers", "can never be placed")
    assert not (tmp_path / "smoke" / "ranks").exists()  # no worker ever started


def test_cli_cuda_graphs_on_a_cpu_only_cluster(shapes_small: Path, tmp_path: Path, shared_ray: SharedRay) -> None:
    """scaling.use_gpu: auto resolves to CPUs here: graphs are refused once Ray says so, before any worker starts."""
    # the small set's own spec: another would regenerate it in place under every later test that uses it
    args = [*small_data(shapes_small), "train.cuda_graphs=true", f"run.storage_path={tmp_path}"]
    proc = yolo_ray("train", *args, cwd=tmp_path, env=shared_ray.env())
    _assert_clean_error(proc, "train.cuda_graphs", "trains on CPUs")
    assert not (tmp_path / "smoke" / "ranks").exists()


def test_accumulate_maps_to_ultralytics_nbs(tmp_path: Path) -> None:
    from yolo_ray.inputs import ultralytics_overrides

    cfg = config.load(None, ["train.batch=16", "train.accumulate=3", "train.weight_decay=0.0005"])
    o = ultralytics_overrides(cfg, "yolo11n.yaml", tmp_path / "data.yaml", tmp_path / "train")
    # Ultralytics: accumulate = round(nbs / batch) = 3; weight decay * batch * accumulate / nbs = unchanged.
    assert (o["batch"], o["nbs"], o["weight_decay"]) == (16, 48, 0.0005)
    assert "nbs" not in ultralytics_overrides(config.load(None, ["train.accumulate=null"]), "m", tmp_path, tmp_path)


def test_ultralytics_style_keys_map_onto_the_config(shapes_small: Path) -> None:
    """A line in Ultralytics' words (`yolo train data=... epochs=... imgsz=... batch=... device=0,1 mosaic=0.5`)
    means the same as its dotted form; other Ultralytics train arguments go to train.extra."""
    data = str(shapes_small / "data.yaml")
    line = [f"data={data}", "model=yolo11n.yaml", "epochs=3", "imgsz=64", "batch=16", "lr0=0.02", "mosaic=0.5"]
    cfg = config.load(None, [*line, "hsv_h=0.01", "device=0,1", "name=uk", "project=somewhere"])
    assert (cfg.data.path, cfg.model, cfg.train.epochs, cfg.train.imgsz, cfg.train.batch) == (
        data,
        "yolo11n.yaml",
        3,
        64,
        16,
    )
    assert cfg.train.lr0 == 0.02 and cfg.train.extra == {"mosaic": 0.5, "hsv_h": 0.01}
    assert (cfg.scaling.use_gpu, cfg.scaling.num_workers) == (True, 2)
    assert (cfg.run.name, cfg.run.storage_path) == ("uk", "somewhere")
    assert config.load(None, ["device=cpu"]).scaling.use_gpu is False
    dotted = config.load(None, [f"data.path={data}", "train.epochs=3", "train.extra.mosaic=0.5"])
    assert (dotted.data.path, dotted.train.epochs, dotted.train.extra) == (data, 3, {"mosaic": 0.5})


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["epochs=3", "train.epochs=5"], "train.epochs", "set twice"),
        (["mosaic=0.5", "train.extra.mosaic=0.3"], "train.extra.mosaic", "set twice"),
        (["device=0,1", "scaling.num_workers=4"], "scaling.num_workers", "set twice"),
        (["device=gpu"], "device", "device=0,1"),
        (["resume=true"], "resume", "resumes by itself"),
        (["epochz=3"], "epochz", "unknown key"),
    ],
)
def test_ultralytics_style_key_errors(overrides: list[str], key: str, words: str, tmp_path: Path) -> None:
    """Both names for one key is an error naming both; Ultralytics keys yolo_ray manages say what to do instead."""
    with pytest.raises(config.ConfigError) as err:
        config.load(None, overrides)
    assert err.value.key == key and words in str(err.value)
    proc = yolo_ray("check", *overrides, "--no-data", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout and key in proc.stdout


def test_error_paragraphs_have_no_runs_of_spaces(tmp_path: Path) -> None:
    err = config.ConfigError("f.yaml", "model", "no such   model\n    file.", "use   e.g. yolo11n.yaml")
    assert str(err) == "f.yaml: model: no such model file. Fix: use e.g. yolo11n.yaml"
    proc = yolo_ray("check", "train.batch=33", "scaling.num_workers=2", "--no-data", cwd=tmp_path)
    assert proc.returncode == 2
    assert all("  " not in line.strip() for line in proc.stdout.splitlines()), proc.stdout

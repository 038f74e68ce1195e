"""Every bad input is caught before Ray starts: exit 2, no traceback, a message naming the file or key and the fix;
`yolo-ray check` and `yolo-ray train` (or `tune`) agree. The commands run in this process (the CLI's own main) with
Ray's connect replaced by a tripwire: a check that let a bad input through would start Ray and fail the test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from yolo_ray import cli
from yolo_ray.data.synth import SynthSpec, generate
from yolo_ray.driver import ray_cluster


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(*_: object, **__: object) -> None:
        raise AssertionError("Ray would start: the bad input got past every check")

    monkeypatch.setattr(ray_cluster, "connect", tripwire)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 8 val images of 3 shapes at 64 px."""
    out = tmp_path_factory.mktemp("base")
    generate(out, SynthSpec(images=16, imgsz=64, classes=3, seed=3))
    return out


def variant(base: Path, tmp: Path, change: object = None, yaml_text: str | None = None) -> Path:
    """A copy of the base dataset, changed by `change(root)` or given another data.yaml; returns its data.yaml."""
    root = tmp / "ds"
    shutil.copytree(base, root)
    data = root / "data.yaml"
    data.write_text(data.read_text().replace(str(base), str(root)))
    if yaml_text is not None:
        data.write_text(yaml_text.replace("ROOT", str(root)))
    if callable(change):
        change(root)
    return data


def first_label(root: Path, split: str = "train", i: int = 0) -> Path:
    return sorted((root / split / "labels").glob("*.txt"))[i]


def add_line(root: Path, line: str) -> None:
    label = first_label(root)
    label.write_text(label.read_text() + line + "\n")


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def both(capsys: pytest.CaptureFixture, tmp: Path, *args: str) -> list[str]:
    """check and train on the same input: both exit 2; returns their messages."""
    given = " ".join(args)
    storage = [] if "run.storage_path=" in given else [f"run.storage_path={tmp / 'runs'}"]
    said = []
    for command in ("check", "train"):
        extra = ["tracking.enabled=false"] if command == "train" and "tracking." not in given else []
        code, text = run(capsys, command, *args, *storage, *extra)
        assert code == 2, text[-2000:]
        assert "Traceback" not in text and "Fix:" in text, text[-2000:]
        said.append(text)
    return said


SETTINGS = [
    (["train.lr0=-1"], "train.lr0", "between 0.0 and 1.0"),
    (["train.lr0=nan"], "train.lr0", "lr0"),
    (["train.momentum=5"], "train.momentum", "between 0.0 and 1.0"),
    (["train.weight_decay=-1"], "train.weight_decay", "between 0.0 and 1.0"),
    (["train.extra.fliplr=5"], "train.extra.fliplr", "between 0.0 and 1.0"),
    (["train.imgsz=99999968"], "train.imgsz", "beyond 8192"),
    (["train.extra.imgsz=65"], "train.extra.imgsz", "set twice"),
    (["train.extra.epochs=2"], "train.extra.epochs", "set twice"),
    (["run.name=.."], "run.name", "not a plain name"),
    (["run.name=yes"], "run.name", "quote the value"),
    (["tracking.alias=v1", "tracking.enabled=true"], "tracking.alias", "reserved"),
    (["tracking.alias=latest", "tracking.enabled=true"], "tracking.alias", "reserved"),
    (["task=segment"], "task", "is segment, but the model yolo11n.yaml is a detect model"),
    (["model=yolo11n-seg.yaml", "data.loader=device"], "data.loader", "moves boxes and keypoints only"),
    (["model=yolo11n-pose.yaml", "train.cuda_graphs=true"], "train.cuda_graphs", "detection only"),
    (["model=yolo11n-seg.yaml", "train.val_cuda_graphs=true"], "train.val_cuda_graphs", "detection only"),
    (["data.max_bad_fraction=2"], "data.max_bad_fraction", "between 0 and 1"),
]


@pytest.mark.parametrize(("overrides", "key", "words"), SETTINGS, ids=[" ".join(c[0]) for c in SETTINGS])
def test_bad_settings(
    overrides: list[str], key: str, words: str, base: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for text in both(capsys, tmp_path, f"data.path={base / 'data.yaml'}", *overrides):
        assert f"{key}:" in text and words in text, text


def test_reserved_aliases_are_refused_where_mlflow_has_moved_its_rule(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow's registry rules are private and were renamed once (3.18), which silently dropped this check: without
    them the reserved aliases are still refused."""
    from mlflow.utils import validation

    for name in dir(validation):
        if "alias" in name and name.startswith("_validate"):
            monkeypatch.delattr(validation, name)
    for alias in ("v7", "LATEST"):
        for text in both(capsys, tmp_path, f"data.path={base / 'data.yaml'}", f"tracking.alias={alias}"):
            assert "tracking.alias:" in text and "reserved" in text, text
    code, text = run(capsys, "check", f"data.path={base / 'data.yaml'}", "tracking.alias=candidate")
    assert code == 0, text[-2000:]


def test_bad_model_files_and_storage(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(np.random.default_rng(0).bytes(4096))
    not_a_model = tmp_path / "dict.pt"
    import torch

    torch.save({"weights": torch.zeros(3)}, not_a_model)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        ([f"model={corrupt}"], "model", "not a readable PyTorch checkpoint"),
        ([f"model={not_a_model}"], "model", "holds no Ultralytics model"),
        ([f"model={tmp_path}"], "model", "is a directory"),
        ([f"run.storage_path={a_file}"], "run.storage_path", "is a file, not a directory"),
        (["run.storage_path=/proc/1/yolo_ray-runs"], "run.storage_path", "cannot be written"),
    ]
    for overrides, key, words in cases:
        for text in both(capsys, tmp_path, f"data.path={base / 'data.yaml'}", *overrides):
            assert f"{key}:" in text and words in text, (overrides, text)


def test_gpus_asked_for_where_there_are_none(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for text in both(capsys, tmp_path, f"data.path={base / 'data.yaml'}", "device=0"):
        assert "scaling.use_gpu:" in text and "has no GPU" in text, text


NAMES_3 = "path: ROOT\ntrain: train/images\nval: val/images\n"
DATASETS = {
    "non-UTF-8 label": (lambda r: first_label(r).write_bytes(b"\xff\xfe\x00 0 0.5 0.5 0.1 0.1\n"), None, "not UTF-8"),
    "class inf": (lambda r: add_line(r, "inf 0.5 0.5 0.1 0.1"), None, "'inf' is not a class id"),
    "class 1.7": (lambda r: add_line(r, "1.7 0.5 0.5 0.1 0.1"), None, "'1.7' is not a class id"),
    "class cat": (lambda r: add_line(r, "cat 0.5 0.5 0.1 0.1"), None, "'cat' is not a class id"),
    "class 7 of 3": (lambda r: add_line(r, "7 0.5 0.5 0.1 0.1"), None, "class id 7; the dataset has nc=3"),
    "names not ints": (None, NAMES_3 + "names: {a: x, b: y, c: z}\n", "Ultralytics rejects it"),
    "unparsable yaml": (None, "train: [unclosed\nval: x\n", "is not valid YAML"),
    "a list": (None, "- train\n- val\n", "holds a list, not a mapping"),
    "train null": (None, "path: ROOT\ntrain: null\nval: val/images\nnames: [a, b, c]\n", "has no `train:` entry"),
    "nc 5 and 3 names": (None, NAMES_3 + "nc: 5\nnames: [a, b, c]\n", "'names' length 3 and 'nc: 5' must match"),
    "val without labels": (lambda r: shutil.rmtree(r / "val" / "labels"), None, "none of its 8 val images"),
}


@pytest.mark.parametrize("case", sorted(DATASETS))
def test_bad_datasets(case: str, base: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    change, yaml_text, words = DATASETS[case]
    data = variant(base, tmp_path, change, yaml_text)
    for text in both(capsys, tmp_path, f"data.path={data}"):
        assert "data.path" in text and str(data) in text and words in text, text
        if "class id" in words:
            assert first_label(data.parent).name in text and "line" in text  # the file and the line


def test_a_directory_is_called_a_directory(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for text in both(capsys, tmp_path, f"data.path={base}"):
        assert f"{base} is a directory" in text
    for command in ("check", "train"):  # the experiment file itself
        code, text = run(capsys, command, str(tmp_path))
        assert code == 2 and f"{tmp_path}: <file>: is a directory" in text, text


def _mess(root: Path) -> list[str]:
    """Four of the 16 train images made unusable the ways a real dataset is: returns their names."""
    images = sorted((root / "train" / "images").glob("*.jpg"))
    images[0].write_bytes(b"")  # zero bytes
    images[1].write_bytes(np.random.default_rng(1).bytes(2000))  # not an image
    Image.new("RGB", (1, 1)).save(images[2])  # 1x1
    first_label(root, i=3).write_text("0 0.5 0.5 1.7 0.2\n")  # not normalised
    return [images[i].name for i in range(4)]


def test_unusable_images_are_named_and_refused_above_the_limit(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Ultralytics drops such images with a warning in one worker's log, and the run finished 'fine' without 14% of
    its data: here they are named before training, and a share above data.max_bad_fraction refuses the run."""
    data = variant(base, tmp_path, _mess)
    bad = sorted(p.name for p in (data.parent / "train" / "images").glob("*.jpg"))[:4]
    for text in both(capsys, tmp_path, f"data.path={data}"):
        assert "4 of 16 train images (25.0%) are unusable" in text and "data.max_bad_fraction=0.01" in text
        assert all(name in text for name in bad), text
    code, text = run(capsys, "check", f"data.path={data}", "data.max_bad_fraction=0.3")
    assert code == 0 and "4 unusable" in text and "under Ultralytics' 10 px minimum" in text, text


def test_unusable_is_what_ultralytics_drops(base: Path, tmp_path: Path) -> None:
    """The read-only checks give Ultralytics' own verdict (verify_image_label) on every image of a messy split."""
    from ultralytics.data.utils import img2label_paths, verify_image_label

    from yolo_ray.data import checks, label_checks

    def more_mess(root: Path) -> None:
        _mess(root)
        for i, text in ((4, "0 0.5 0.5 0.1\n"), (5, "0 0.5 0.5 0.1 0.1 0.3\n"), (6, "0 -0.5 0.5 0.1 0.1\n")):
            first_label(root, i=i).write_text(text)
        first_label(root, i=7).write_text("0 x 0.5 0.1 0.1\n")

    data = variant(base, tmp_path, more_mess)
    split = label_checks.Split(checks.split_images(data, "train"))
    label_checks.scan(split, label_checks.LabelRule(3, "detect", "test", "data.path"))
    ours = sorted(Path(f).name for f, _ in split.unusable)
    labels = img2label_paths(split.images)
    theirs = sorted(
        Path(im).name
        for im, lb in zip(split.images, labels, strict=True)
        if verify_image_label((im, lb, "", False, 3, 0, 0, False))[8]
    )
    assert ours == theirs and len(ours) == 8, (ours, theirs)


def test_bad_sweeps(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A sweep's scheduler and metric are checked by `check` and by `tune` before any trial (they crashed after the
    first trial trained)."""
    space = "tune.space={train.lr0: {loguniform: [0.001, 0.1]}}"
    for overrides, key, words in (
        (["tune.reduction_factor=1"], "tune.reduction_factor", "must be >= 2"),
        (["tune.grace_period=0"], "tune.grace_period", "outside 1..train.epochs"),
        (["tune.metric=mAP75"], "tune.metric", "not a metric every epoch reports"),
    ):
        args = [f"data.path={base / 'data.yaml'}", space, *overrides, f"run.storage_path={tmp_path}"]
        for command in ("check", "tune"):
            code, text = run(capsys, command, *args, "tracking.enabled=false")
            assert code == 2 and f"{key}:" in text and words in text and "Traceback" not in text, text


def test_paths_are_resolved_where_the_user_runs(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`path: .`, a .txt list with lines relative to the working directory, and a nested symlinked image folder
    (which Ultralytics reads) are resolved on the driver as Ultralytics would from there; the workers get a
    data.yaml of absolute paths (what train writes into the run directory)."""
    from yolo_ray import config, inputs

    root = tmp_path / "project"
    shutil.copytree(base / "train", root / "data" / "train")
    (root / "val" / "images").mkdir(parents=True)
    (root / "val" / "images" / "nested").symlink_to(base / "val" / "images", target_is_directory=True)
    (root / "val" / "labels").mkdir()
    (root / "val" / "labels" / "nested").symlink_to(base / "val" / "labels", target_is_directory=True)
    images = sorted((root / "data" / "train" / "images").glob("*.jpg"))
    (root / "train.txt").write_text("".join(f"data/train/images/{p.name}\n" for p in images))
    (root / "data.yaml").write_text("path: .\ntrain: train.txt\nval: val/images\nnames: [a, b, c]\n")
    monkeypatch.chdir(root)
    code, text = run(capsys, "check", "data.path=data.yaml", "tracking.enabled=false")
    assert code == 0 and "train: 16 images" in text and "val: 8 images" in text, text
    checked = inputs.prepare(config.load(None, ["data.path=data.yaml", f"run.storage_path={tmp_path / 'runs'}"]))
    out = yaml.safe_load(checked.dataset.write(tmp_path / "run").read_text())
    assert out["path"] == str(root) and out["val"] == str(root / "val" / "images")
    listed = Path(out["train"]).read_text().split()
    assert listed == [str(p) for p in images] and all(Path(p).is_absolute() for p in listed)
    assert json.dumps(out)  # plain types only: Ultralytics reads it in the workers


TASK_DATASETS = [  # a detection dataset given to the other tasks' models: each refused with what that task needs
    ("yolo11n-seg.yaml", "a segment model learns masks from polygon labels"),
    ("yolo11n-pose.yaml", "a pose model needs `kpt_shape"),
    ("yolo11n-obb.yaml", "5 columns; obb labels have 9 (class x1 y1 x2 y2 x3 y3 x4 y4"),
    ("yolo11n-cls.yaml", "is not a folder; a classification dataset is one"),
]


@pytest.mark.parametrize(("model", "words"), TASK_DATASETS, ids=[m for m, _ in TASK_DATASETS])
def test_a_dataset_of_another_task_is_refused(
    model: str, words: str, base: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for text in both(capsys, tmp_path, f"data.path={base / 'data.yaml'}", f"model={model}", "data.max_bad_fraction=0"):
        assert "data.path" in text and words in text, text


def test_a_pose_dataset_with_a_bad_flip_idx_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """flip_idx must name each keypoint once: Ultralytics checks only its length, and only once training starts."""
    from yolo_ray.data.synth import SynthSpec, generate

    data_yaml = generate(tmp_path / "pose", SynthSpec(images=16, imgsz=64, classes=1, task="pose"))
    spec = yaml.safe_load(data_yaml.read_text())
    data_yaml.write_text(yaml.safe_dump({**spec, "flip_idx": [0, 0, 3, 2]}))
    for text in both(capsys, tmp_path, f"data.path={data_yaml}", "model=yolo11n-pose.yaml", "data.loader=device"):
        assert "data.path" in text and "flip_idx [0, 0, 3, 2]" in text and "each of the 4 keypoints once" in text


def test_the_workers_plan_is_decided_once_on_the_driver(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What crosses to every Ray Train worker is one frozen, typed plan that pickles as it is: Ultralytics' arguments,
    the batch rule an elastic group applies at each size (the same images per optimizer step), faults (the
    environment's YOLO_RAY_FAIL_AT read in the worker), and no stream or async validation unless asked for."""
    import dataclasses
    import pickle
    from types import SimpleNamespace

    from yolo_ray import config, inputs
    from yolo_ray.driver import launcher
    from yolo_ray.faults import FaultPlan

    cfg = config.load(None, [f"data.path={base / 'data.yaml'}", "train.batch=16", "train.accumulate=2",
                             "scaling.num_workers=[1,4]", "run.fail_at_epoch=2", "run.fail_rank=1",
                             f"run.storage_path={tmp_path}", "data.loader=device"])  # fmt: skip
    checked = inputs.prepare(cfg)
    run_dir = tmp_path / "run"
    plan = launcher.plan_workers(cfg, checked, checked.dataset.write(run_dir), run_dir, SimpleNamespace(num_workers=4))
    assert pickle.loads(pickle.dumps(plan)) == plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.loader = "ultralytics"  # type: ignore[misc]
    assert plan.run_dir == str(run_dir) and plan.loader == "device" and plan.overrides["epochs"] == cfg.train.epochs
    assert plan.stream is None and plan.val_async is None and plan.export  # MLflow on by default: ONNX registered
    for world in (1, 2, 4):  # 4 images a worker at every size; accumulation keeps 32 images an optimizer step
        args = plan.batch.ultralytics(world)
        assert plan.batch.per_worker(world) == 4 and args == {"batch": 4 * world, "nbs": 32}
    assert plan.fault == FaultPlan(2, 1, None) and plan.fault.or_env() == plan.fault
    monkeypatch.setenv("YOLO_RAY_FAIL_AT", "3:0")
    assert plan.fault.or_env() == FaultPlan(3, 0)

"""Ultralytics' own argument names on yolo_ray's command line: `epochs=3 imgsz=640 batch=64 data=coco.yaml device=0,1`.

A line copied from Ultralytics' docs (`yolo train data=... model=... epochs=100 imgsz=640 batch=64 device=0,1`) works
as it is: each plain Ultralytics key becomes the config key it means (the table below), and any other Ultralytics
train argument (mosaic, hsv_h, fliplr, ...) goes to `train.extra`. The dotted form keeps working; setting one key both
ways is an error, not a silent winner.
"""

from __future__ import annotations

from yolo_ray.config_schema import ConfigError

# Ultralytics' name -> yolo_ray's config key
TO_CONFIG = {
    **{k: f"train.{k}" for k in ("epochs", "imgsz", "batch", "workers", "lr0", "lrf", "optimizer", "momentum")},
    **{k: f"train.{k}" for k in ("weight_decay", "warmup_epochs", "cos_lr", "amp", "cache", "seed", "deterministic")},
    **{k: f"train.{k}" for k in ("close_mosaic", "patience", "val", "plots")},
    "data": "data.path",
    "name": "run.name",
    "project": "run.storage_path",
}
SECTIONS = {"model", "task", "data", "train", "scaling", "run", "tracking", "tune"}  # the config's own top-level keys
NOT_HERE = {  # Ultralytics keys with no meaning here, and what to use instead
    "resume": "re-run the same run.name: a yolo_ray run resumes by itself",
    "nbs": "set train.accumulate (images per optimizer step = batch x accumulate)",
    "save_dir": "set run.storage_path and run.name",
    "exist_ok": "a run directory is reused by re-running its run.name",
    "mode": "use `yolo-ray train` or `yolo-ray tune`",
}


def help_text() -> str:
    pairs = ", ".join(f"{k}={v}" for k, v in TO_CONFIG.items())
    return (
        f"Ultralytics-style keys: {pairs}; model=PATH as is; device=cpu (scaling.use_gpu=false), device=0 (one GPU "
        "worker), device=0,1 (two GPU workers: Ray picks the GPUs); any other Ultralytics train argument "
        "(mosaic=0.5, hsv_h=0.01, ...) -> train.extra.KEY."
    )


def _device(value: str, source: str) -> list[str]:
    """device=cpu | 0 | 0,1,...: Ultralytics' device list read as the worker count and GPU use."""
    text = str(value).strip().lower()
    if text == "cpu":
        return ["scaling.use_gpu=false"]
    ids = [x.strip() for x in text.split(",") if x.strip()]
    if not ids or not all(x.isdigit() for x in ids):
        raise ConfigError(
            source, "device", f"{value!r} is not a device list.", "use device=cpu, device=0 or device=0,1,2,3."
        )
    return ["scaling.use_gpu=true", f"scaling.num_workers={len(ids)}"]


def translate(items: list[str], source: str, train_keys: set[str]) -> list[str]:
    """The overrides with Ultralytics' plain keys rewritten as dotted config keys (train_keys: Ultralytics' train
    argument names). Raises ConfigError when one config key is set twice, by both names."""
    out: list[str] = []
    origin: dict[str, tuple[str, bool]] = {}  # config key -> (the override that set it, by a plain Ultralytics key)
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or "." in key or (key in SECTIONS and key != "data"):
            mapped = [item]
        elif key == "data" and value.strip().startswith("{"):  # a whole data section, YAML flow style
            mapped = [item]
        elif key in NOT_HERE:
            raise ConfigError(source, key, "is an Ultralytics argument yolo_ray manages itself.", NOT_HERE[key] + ".")
        elif key == "device":
            mapped = _device(value, source)
        elif key in TO_CONFIG:
            mapped = [f"{TO_CONFIG[key]}={value}"]
        elif key in train_keys:
            mapped = [f"train.extra.{key}={value}"]
        else:
            mapped = [item]  # unknown: the config's own check names it, with a suggestion
        plain = mapped != [item]
        for m in mapped:
            target = m.partition("=")[0].strip()
            before, before_plain = origin.get(target, (item, False))
            if before != item and (plain or before_plain):  # dotted twice: the later wins, as always
                raise ConfigError(
                    source,
                    target,
                    f"is set twice: by `{before}` and by `{item}`.",
                    "keep one of them (Ultralytics' name or the dotted key).",
                )
            origin[target] = (item, plain)
        out += mapped
    return out

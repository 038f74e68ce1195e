"""What a generated dataset is (`yolo-ray data synth OUT key=value ...`): its size, style, task and seed. Generating
it is synth.py's (the shapes style), scenes.py's (real) and task_synth.py's (the other tasks)."""

from __future__ import annotations

from dataclasses import dataclass

from yolo_ray.data.shape_drawing import SHAPES, TASK_MAX_CLASSES

STYLES = ("shapes", "real")


@dataclass(frozen=True)
class SynthSpec:
    """What to generate; `images` is the train split size, val gets a fifth of it (at least 8). imgsz: the square
    side (shapes) or the scale of the image sizes (real: 320x240 to 1280x720 at 640). max_objects: 0 is the style's
    own (4 for shapes, 15 for real)."""

    images: int = 256
    imgsz: int = 128
    classes: int = 3
    seed: int = 0
    max_objects: int = 0
    style: str = "shapes"
    task: str = "detect"  # detect, or segment / obb / pose / classify (task_synth.py: shapes style only)

    @property
    def val_images(self) -> int:
        return max(8, self.images // 5)

    @property
    def objects_limit(self) -> int:
        return self.max_objects or (15 if self.style == "real" else 4)

    def record(self) -> dict:
        """What data.yaml records of the spec, to tell whether a generated set is the one asked for."""
        out = {"images": self.images, "imgsz": self.imgsz, "classes": self.classes, "seed": self.seed}
        if self.style != "shapes" or self.max_objects:  # sets generated before styles existed stay valid
            out.update(style=self.style, max_objects=self.objects_limit)
        if self.task != "detect":
            out["task"] = self.task
        return out

    def validate(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if not 1 <= self.classes <= len(SHAPES):
            raise ValueError(f"classes must be between 1 and {len(SHAPES)} (one per shape), got {self.classes}")
        if self.task != "detect":
            if self.task not in TASK_MAX_CLASSES or self.style != "shapes":
                raise ValueError(f"task {self.task!r}: one of {', '.join(TASK_MAX_CLASSES)}, in the shapes style")
            if self.classes > TASK_MAX_CLASSES[self.task]:
                raise ValueError(f"task {self.task}: classes must be at most {TASK_MAX_CLASSES[self.task]}")
        if self.images < 1 or self.imgsz < 32 or self.max_objects < 0:
            raise ValueError("images >= 1, imgsz >= 32 and max_objects >= 0 are required")

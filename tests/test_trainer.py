"""RayTrainer's seams that need no Ray to check (the rest runs in test_launcher / test_faults)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from yolo_ray import ultralytics_env

ultralytics_env.setup()
from yolo_ray.worker.trainer import GRAPHS_COMPILE_MARK, _graphed_compile  # noqa: E402


@pytest.mark.parametrize(
    ("saved", "expected"),
    [
        (GRAPHS_COMPILE_MARK, False),  # last.pt of a graphed run, resumed with graphs off: eager, not torch.compile
        (True, True),  # the user's own train.extra.compile stays as it is
        (False, False),
    ],
)
def test_resume_with_graphs_off_never_turns_into_torch_compile(saved: object, expected: object) -> None:
    import ultralytics.engine.trainer as base_trainer

    trainer = SimpleNamespace(cuda_graphs=False, args=SimpleNamespace(compile=saved))
    original = base_trainer.attempt_compile
    with _graphed_compile(trainer):
        assert base_trainer.attempt_compile is original  # Ultralytics' own compile step, untouched
    assert trainer.args.compile == expected

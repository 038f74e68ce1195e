"""worker/val_graphs.py: inline validation's forward replayed as CUDA graphs gives the eager forward's outputs to the
bit, follows the EMA's weights as they are updated in place, and leaves the model as it found it. The replay itself
needs a GPU; on the CPU the model runs eagerly through the same seam. val_async's validator with graphs gives the
eager validator's metrics."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_flatten
from ultralytics.nn.tasks import DetectionModel

from yolo_ray.worker.val_graphs import EvalGraphs


def _model(device: str) -> DetectionModel:
    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=5, verbose=False).to(device).eval()
    return model.to(memory_format=torch.channels_last) if device == "cuda" else model


def _same(a: object, b: object) -> bool:
    (la, sa), (lb, sb) = tree_flatten(a), tree_flatten(b)
    return sa == sb and all(torch.equal(x, y) if torch.is_tensor(x) else x == y for x, y in zip(la, lb, strict=True))


def _head(model: DetectionModel) -> torch.nn.Module:
    return model.model[-1]


def test_on_the_cpu_validation_runs_eagerly_and_the_model_is_left_as_it_was() -> None:
    model, graphs = _model("cpu"), EvalGraphs()
    x = torch.rand(2, 3, 128, 160)
    with torch.inference_mode():
        want = model(x)
        for _ in range(3):  # seen, then a shape it would capture on a GPU
            with graphs.installed(model):
                assert "forward" in model.__dict__
                assert _same(model(x, augment=False), want)
    assert "forward" not in model.__dict__ and not graphs.graphs
    assert _head(model).shape is None  # an eager call after validation makes its own anchors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="replays CUDA graphs")
def test_replays_give_the_eager_forward_to_the_bit_and_follow_weights_updated_in_place() -> None:
    """As the validator calls it (inference mode, fp16 images under autocast, rect batches of two shapes): pass 1
    runs eagerly, pass 2 captures, pass 3 replays; every pass equals the eager forward. Then the weights move in
    place, as the EMA's lerp moves them, and a replay gives the new weights' forward; tensors made anew drop the
    graphs (that validation runs eagerly)."""
    model, graphs = _model("cuda"), EvalGraphs()
    batches = [torch.rand(4, 3, 256, 320, device="cuda").half(), torch.rand(3, 3, 320, 256, device="cuda").half()]

    def passes() -> list[object]:
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            return [model(x, augment=False) for x in batches]

    want = passes()
    for n in range(3):
        with graphs.installed(model):
            got = passes()
        assert all(_same(g, w) for g, w in zip(got, want, strict=True)), n
        assert len(graphs.graphs) == (0 if n == 0 else 2) and not graphs.failed
    with torch.no_grad():
        params = [p for p in model.parameters() if p.dtype.is_floating_point]
        torch._foreach_lerp_(params, [torch.randn_like(p) * 0.1 for p in params], 0.3)
    want = passes()
    with graphs.installed(model):
        got = passes()
    assert all(_same(g, w) for g, w in zip(got, want, strict=True)) and len(graphs.graphs) == 2
    held = [t.data for t in (*model.parameters(), *model.buffers())]  # so the new tensors cannot take their place
    model.half().float()  # new tensors, as Ultralytics 8.3 casts the EMA for each validation: the graphs go
    want = passes()
    with graphs.installed(model):
        got = passes()
    assert all(_same(g, w) for g, w in zip(got, want, strict=True)) and not graphs.graphs and held
    assert "forward" not in model.__dict__


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU"))]
)
def test_the_async_validator_with_graphs_gives_the_eager_validators_metrics(shapes_small: Path, tmp_path: Path,
                                                                          device: str) -> None:  # fmt: skip
    """train.val_async's validator (the thread runner's, in this process) with train.val_cuda_graphs: three epochs'
    weights loaded into its model (eager, captured, replayed) give the eager validator's metrics and val losses to
    the bit; on the CPU there is nothing to graph and it validates eagerly."""
    from yolo_ray.worker.async_val import Validator

    overrides = {"model": "yolo11n.yaml", "data": str(shapes_small / "data.yaml"), "imgsz": 64, "task": "detect",
                 "epochs": 3, "batch": 8, "workers": 0, "plots": False, "verbose": False}  # fmt: skip
    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=3, verbose=False)  # shapes_small's classes
    made = {g: Validator({**overrides, "save_dir": str(tmp_path / str(g))}, copy.deepcopy(model), 8, 0, {},
                         device=device, cuda_graphs=g) for g in (False, True)}  # fmt: skip
    assert (made[True].graphs is not None) == (device == "cuda") and made[False].graphs is None
    shapes = dict.fromkeys(("box_loss", "cls_loss", "dfl_loss"), ())
    for epoch in range(3):
        state = {k: v * (1 + 0.05 * epoch) if v.dtype.is_floating_point else v for k, v in model.state_dict().items()}
        out = {g: v.validate(epoch, {k: t.to(device) for k, t in state.items()}, shapes) for g, v in made.items()}
        assert out[True]["metrics"] == out[False]["metrics"] and out[True]["fitness"] == out[False]["fitness"], epoch
        assert any(v != 0 for k, v in out[False]["metrics"].items() if "loss" in k)  # something to compare
    if device == "cuda":
        assert made[True].graphs.graphs and not made[True].graphs.failed  # it did replay

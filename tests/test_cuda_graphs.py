"""GraphedModel: on the CPU (CI) a transparent wrapper Ultralytics unwraps; on a GPU (run with the device tool) the
graphed step computes what the eager step computes."""

from __future__ import annotations

import copy

import pytest
import torch

from yolo_ray import ultralytics_env
from yolo_ray.worker.cuda_graphs import GraphedModel

ultralytics_env.setup()
from ultralytics.nn.tasks import DetectionModel  # noqa: E402
from ultralytics.utils import DEFAULT_CFG  # noqa: E402
from ultralytics.utils.torch_utils import ModelEMA, unwrap_model  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run it with the device tool)")


def shapes_batch(b: int, s: int, seed: int) -> dict[str, torch.Tensor]:
    """A training batch as Ultralytics' collate gives it: images in [0, 1], three boxes per image."""
    g = torch.Generator().manual_seed(seed)
    n = 3
    return {
        "img": torch.rand(b, 3, s, s, generator=g),
        "batch_idx": torch.arange(b).repeat_interleave(n).float(),
        "cls": torch.randint(0, 3, (b * n, 1), generator=g).float(),
        "bboxes": torch.rand(b * n, 4, generator=g) * 0.4 + 0.3,  # xywh, normalised
    }


def _model(dev: str = "cpu") -> DetectionModel:
    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=3, verbose=False).to(dev)
    model.args = DEFAULT_CFG
    return model.train()


def test_on_cpu_the_wrapper_is_the_model_as_ultralytics_sees_it() -> None:
    model = _model()
    wrapped = GraphedModel(model)
    assert unwrap_model(wrapped) is model and wrapped.stride is model.stride
    assert ModelEMA(wrapped).ema.state_dict().keys() == model.state_dict().keys()
    img = torch.rand(2, 3, 64, 64)
    eager, through = model(img), wrapped(img)
    assert torch.equal(eager["scores"], through["scores"]) and wrapped._graphed is None  # nothing captured on CPU


def _loss_and_grads(model: DetectionModel, forward, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss, _ = model.loss(batch, forward(batch["img"]))
    loss.sum().backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


@cuda
def test_graphed_step_matches_the_eager_step_and_falls_back_off_shape() -> None:
    eager = _model("cuda")
    model = copy.deepcopy(eager)
    wrapped = GraphedModel(model)
    for seed in (1, 2):  # the second batch goes through the static input copy, not the capture sample
        batch = {k: v.cuda() for k, v in shapes_batch(8, 128, seed).items()}
        ref_loss, ref_grads = _loss_and_grads(eager, eager, batch)
        loss, grads = _loss_and_grads(model, wrapped, batch)
        assert wrapped._graphed is not None
        torch.testing.assert_close(loss, ref_loss, rtol=2e-3, atol=2e-3)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-3)
        for b, r in zip(model.buffers(), eager.buffers(), strict=True):  # the capture's warm-up left no trace
            torch.testing.assert_close(b, r, rtol=1e-3, atol=1e-3)
    small = {k: v.cuda() for k, v in shapes_batch(4, 128, 3).items()}  # the last, smaller batch: eager
    ref_loss, _ = _loss_and_grads(eager, eager, small)
    loss, _ = _loss_and_grads(model, wrapped, small)
    torch.testing.assert_close(loss, ref_loss, rtol=2e-3, atol=2e-3)
    model.eval()
    assert isinstance(wrapped(small["img"]), tuple)  # eval mode: the model's inference output, eagerly

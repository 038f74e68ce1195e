"""The val split's batches kept on the GPU after their first pass (validation every epoch on a GPU).

Ultralytics' val loader letterboxes every val image again at every validation (its rect batches, padded to the
stride), on CPU processes, and copies each batch to the GPU. Validation has no randomness, so the first pass's
batches are the batches of every later pass: kept on the device they cost no CPU work and no copy from then on, and
the validator computes the same metrics from the same tensors. What does not fit the budget is served by the loader
as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

DEVICE_SHARE = 0.1  # of the device's free memory (at the first pass) the kept batches may take


class DeviceValBatches:
    """Ultralytics' val DataLoader, whose batches are kept on `device` after the first full pass (when they fit);
    every attribute the validators read (`dataset`, `sampler`, `batch_size`, ...) is the loader's."""

    def __init__(self, loader: Any, device: torch.device):
        self.loader, self.device = loader, device
        self.kept: list[dict[str, Any]] | None = None
        self.fits: bool | None = None  # whether they may be kept: decided at the first pass

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # only for what this class does not define
        return getattr(self.__dict__["loader"], name)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.kept is not None:
            for batch in self.kept:
                yield dict(batch)  # the validator replaces batch entries (img -> float): the kept dict stays as kept
            return
        if self.fits is None:
            self.fits = self._fits()
        if not self.fits:
            yield from self.loader
            return
        kept = []
        for batch in self.loader:
            on_device = {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
            kept.append(on_device)
            yield dict(on_device)
        self.kept = kept  # only a whole pass is kept (a pass broken off keeps nothing)

    def _fits(self) -> bool:
        """The val images at imgsz² (rect batches are smaller) within DEVICE_SHARE of the free memory."""
        imgsz = int(getattr(self.loader.dataset, "imgsz", 640))
        need = len(self.loader.dataset) * imgsz * imgsz * 3
        free, _ = torch.cuda.mem_get_info(self.device)
        return need <= DEVICE_SHARE * free


def on_device(loader: Any, device: torch.device) -> Any:
    """The loader whose batches stay on a CUDA `device` after its first pass; unchanged on other devices."""
    if device.type != "cuda" or isinstance(loader, DeviceValBatches):
        return loader
    return DeviceValBatches(loader, device)

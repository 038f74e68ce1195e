"""Where a loader's epoch went, stage by stage: seconds of wall time each thread spent in each stage (a stage is timed
on the thread that runs it, so stages of two threads overlap). The stream loader keeps one per epoch; the epoch's
metrics carry it as feed/<stage>_s (metrics.epoch_metrics), so a run's history says whether its GPU waited for data
and, if so, which stage held it."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


class FeedClock:
    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t

    def timed(self, name: str, items: Iterable[T]) -> Iterator[T]:
        """`items`, each wait for the next one timed as `name`, the first one's as `name`_first (an epoch's start);
        the time spent with an item is not."""
        it, stage = iter(items), f"{name}_first"
        while True:
            with self.stage(stage):
                try:
                    item = next(it)
                except StopIteration:
                    return
            stage = name
            yield item

    def metrics(self) -> dict[str, float]:
        return {f"feed/{k}_s": round(v, 4) for k, v in sorted(self.seconds.items())}

"""A batch's image bytes as one buffer and its offsets, as Arrow keeps a binary column: how they travel from Ray Data
to the rank's decoding processes (decode_pool.py) without a Python object an image. Ray Data's numpy batches made a
bytes object of every image (~130 KB each) and the pool pickled them through pipes, all under the training process's
GIL: on an H100 (py-spy --gil, streamworker, 2026-12-06) Arrow's to_numpy and the pickling held it ~5% of the epoch,
beside a training thread that needs it between its kernels. Now the buffer is copied once into shared memory and the
processes get offsets."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PackedBytes:
    """Item i is values[offsets[i]:offsets[i + 1]] (a memoryview: no copy)."""

    offsets: np.ndarray  # int64, len + 1
    values: np.ndarray  # uint8

    @classmethod
    def from_list(cls, items: Sequence[bytes]) -> PackedBytes:
        sizes = np.fromiter((len(b) for b in items), dtype=np.int64, count=len(items))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return cls(offsets, np.frombuffer(b"".join(items), dtype=np.uint8))

    @classmethod
    def from_arrow(cls, column: Any) -> PackedBytes:
        """A pyarrow binary or large_binary column (chunked or not), its buffers shared, not copied."""
        import pyarrow as pa

        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if len(arr) == 0:
            return cls(np.zeros(1, np.int64), np.zeros(0, np.uint8))
        width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
        _, offsets, values = arr.buffers()
        off = np.frombuffer(offsets, dtype=width)[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
        return cls(off, np.frombuffer(values, dtype=np.uint8) if values is not None else np.zeros(0, np.uint8))

    @classmethod
    def of(cls, data: Any) -> PackedBytes:
        return data if isinstance(data, PackedBytes) else cls.from_list([bytes(d) for d in data])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> memoryview:
        return memoryview(self.values[self.offsets[i] : self.offsets[i + 1]])

    def __iter__(self) -> Iterator[memoryview]:
        return (self[i] for i in range(len(self)))

    def span(self) -> np.ndarray:
        """The bytes of all items, contiguous (a view)."""
        return self.values[self.offsets[0] : self.offsets[-1]]


def arrow_rows(table: Any) -> dict[str, Any]:
    """A Ray Data batch in pyarrow format as the stream loader reads rows: ids as numpy, file names and packed label
    rows as small Python lists, image bytes as PackedBytes."""
    return {
        "id": table.column("id").to_numpy(),
        "file": table.column("file").to_pylist(),
        "labels": table.column("labels").to_pylist(),
        "data": PackedBytes.from_arrow(table.column("data")),
    }

"""How yolo_ray's Triton kernels are launched: compiled for GPU tensors, in Triton's interpreter for CPU tensors (how
the tests hold them to their references on a machine without a GPU)."""

from __future__ import annotations

import functools
from typing import Any

import triton


@functools.cache
def launcher(fn: Any, interpret: bool, do_not_specialize: tuple[str, ...] = ()) -> Any:
    """The kernel function fn, to be launched as launcher(fn, interpret)[grid](...); do_not_specialize: the int
    arguments compiled for any value (triton.jit's)."""
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    return triton.jit(fn, do_not_specialize=list(do_not_specialize))


def interpreter_takes_loaded_scalars() -> bool:
    """Whether Triton's interpreter can loop to or branch on a value a kernel loaded (the NMS kernel does): from
    Triton 3.7 on; 3.6's raises "only 0-dimensional arrays can be converted". Compiled kernels are not affected."""
    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    return (major, minor) >= (3, 7)

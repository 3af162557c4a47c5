"""The dtypes the kernels take, written once: the entry-point suffixes and the dtype sums run in.

Every ``.cu`` file has one ``extern "C"`` entry point per dtype, named ``<op>_<suffix>`` (``ig_accumulate_f32``);
:data:`KERNEL_DTYPES` are the dtypes every kernel family takes, and ``kernels/ig.cu`` also has float64 ones
(:data:`lightning_ig.ops.ig.IG_DTYPES`). Twins and kernels accumulate in :func:`accumulate_dtype`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["KERNEL_DTYPES", "accumulate_dtype", "dtype_suffix"]

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes every kernel family has entry points for (half precision accumulates in float32)."""

_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}


def dtype_suffix(dtype: torch.dtype, dtypes: Sequence[torch.dtype] = KERNEL_DTYPES) -> str:
    """The kernel-name suffix for ``dtype`` (``f32``, ``f16``, ``bf16``, ``f64``), one of ``dtypes``.

    Raises:
        TypeError: the kernels have no entry point for ``dtype`` (it is not one of ``dtypes``).
    """
    if dtype not in dtypes:
        raise TypeError(f"the CUDA kernels take {', '.join(str(d) for d in dtypes)}; got {dtype}")
    return _SUFFIX[dtype]


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums run in: float64 for float64 inputs, float32 for every other."""
    return torch.float64 if dtype == torch.float64 else torch.float32

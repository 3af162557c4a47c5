"""The dtypes the kernels take: their entry-point suffixes, and the dtype sums run in."""

from __future__ import annotations

import pytest
import torch

from lightning_ig.ops.dtypes import KERNEL_DTYPES, accumulate_dtype, dtype_suffix
from lightning_ig.ops.ig import IG_DTYPES


def test_suffixes_name_every_kernel_dtype_once() -> None:
    suffixes = [dtype_suffix(dtype, IG_DTYPES) for dtype in IG_DTYPES]
    assert len(set(suffixes)) == len(IG_DTYPES) and set(KERNEL_DTYPES) <= set(IG_DTYPES)
    assert [dtype_suffix(dtype) for dtype in KERNEL_DTYPES] == ["f32", "f16", "bf16"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.complex64])
def test_a_dtype_without_an_entry_point_is_a_type_error_naming_both(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=f"the CUDA kernels take torch.float32, .*; got {dtype}"):
        dtype_suffix(dtype)


def test_half_precision_accumulates_in_float32_and_float64_in_float64() -> None:
    assert [accumulate_dtype(dtype) for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)] == [
        torch.float32,
        torch.float32,
        torch.float32,
        torch.float64,
    ]

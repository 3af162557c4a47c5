"""The CuPy loader's CPU-side behaviour: kernel discovery, backend choice, argument types."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_ig.ops import _cupy
from lightning_ig.ops.dtypes import dtype_suffix
from lightning_ig.ops.ig import IG_DTYPES


def test_kernel_sources_are_found_with_a_line_directive() -> None:
    directory = _cupy.kernel_dir()
    assert (directory / "common.cuh").is_file()
    for path in directory.glob("*.cu"):
        source = _cupy.kernel_source(path.name)
        assert source.startswith(f'#line 1 "{path.as_posix()}"\n')


def test_missing_kernel_file_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="no kernel source 'nope.cu'"):
        _cupy.kernel_source("nope.cu")


def test_auto_backend_is_torch_for_cpu_tensors() -> None:
    assert _cupy.choose_backend("auto", torch.zeros(2)) == "torch"
    assert _cupy.choose_backend("torch", torch.zeros(2)) == "torch"


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'cuda', 'torch'; got 'triton'"):
        _cupy.choose_backend("triton", torch.zeros(2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_backend_without_a_device_never_falls_back() -> None:
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA device"):
        _cupy.choose_backend("cuda", torch.zeros(2))


def test_scalar_arguments_have_the_kernels_exact_types() -> None:
    assert isinstance(_cupy.int32(7), np.int32)
    assert isinstance(_cupy.int64(2**40), np.int64)
    assert isinstance(_cupy.pointer(torch.zeros(1)), np.uint64)
    with pytest.raises(OverflowError, match="does not fit a 32-bit"):
        _cupy.int32(2**31)


def test_dtype_suffixes_and_unsupported_dtypes() -> None:
    assert dtype_suffix(torch.float32) == "f32"
    assert dtype_suffix(torch.bfloat16) == "bf16"
    with pytest.raises(TypeError, match="got torch.float64"):
        dtype_suffix(torch.float64)
    assert dtype_suffix(torch.float64, IG_DTYPES) == "f64"  # ig.cu alone has float64 entry points


def test_missing_cupy_gives_the_install_hint() -> None:
    def no_cupy(name: str):  # type: ignore[no-untyped-def]
        raise ImportError(f"No module named {name!r}")

    cupy = _cupy.CupyImport(import_module=no_cupy)
    assert cupy.module() is None and isinstance(cupy.error, ImportError)
    with pytest.raises(
        RuntimeError, match=r"needs CuPy, which failed to import.*pip install cupy-cuda12x.*cupy-cuda13x"
    ):
        cupy.require()


def test_cupy_is_imported_once() -> None:
    imported: list[str] = []

    def fake(name: str):  # type: ignore[no-untyped-def]
        imported.append(name)
        return np  # any module stands in

    cupy = _cupy.CupyImport(import_module=fake)
    assert cupy.require() is np and cupy.module() is np and imported == ["cupy"]

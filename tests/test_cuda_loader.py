"""The CuPy loader's CPU-side behaviour: kernel discovery, backend choice, argument checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_ig import _cuda


def test_kernel_sources_are_found_with_a_line_directive() -> None:
    directory = _cuda.kernel_dir()
    assert (directory / "common.cuh").is_file()
    for path in directory.glob("*.cu"):
        source = _cuda.kernel_source(path.name)
        assert source.startswith(f'#line 1 "{path.as_posix()}"\n')


def test_missing_kernel_file_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="no kernel source 'nope.cu'"):
        _cuda.kernel_source("nope.cu")


def test_auto_backend_is_torch_for_cpu_tensors() -> None:
    assert _cuda.resolve_backend("auto", torch.zeros(2)) == "torch"
    assert _cuda.resolve_backend("torch", torch.zeros(2)) == "torch"


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be 'auto', 'cuda' or 'torch', got 'triton'"):
        _cuda.resolve_backend("triton", torch.zeros(2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_backend_without_a_device_never_falls_back() -> None:
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA device"):
        _cuda.resolve_backend("cuda", torch.zeros(2))


def test_scalar_arguments_have_the_kernels_exact_types() -> None:
    assert isinstance(_cuda.int32(7), np.int32)
    assert isinstance(_cuda.int64(2**40), np.int64)
    assert isinstance(_cuda.float32(0.5), np.float32)
    with pytest.raises(OverflowError, match="does not fit a 32-bit"):
        _cuda.int32(2**31)


def test_dtype_suffixes_and_unsupported_dtypes() -> None:
    assert _cuda.dtype_suffix(torch.float32) == "f32"
    assert _cuda.dtype_suffix(torch.bfloat16) == "bf16"
    with pytest.raises(TypeError, match="got torch.float64"):
        _cuda.dtype_suffix(torch.float64)


def test_tensor_checks_name_the_argument() -> None:
    with pytest.raises(TypeError, match="inputs must be a torch.Tensor, got list"):
        _cuda.check_cuda_tensor("inputs", [1.0])
    with pytest.raises(ValueError, match="inputs must be on a CUDA device, got cpu"):
        _cuda.check_cuda_tensor("inputs", torch.zeros(3))


def test_missing_cupy_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cuda, "_cupy", None)
    monkeypatch.setattr(_cuda, "_cupy_error", ImportError("No module named 'cupy'"))
    assert not _cuda.cupy_available()
    with pytest.raises(RuntimeError, match=r"pip install 'lightning-ig\[cuda12\]'"):
        _cuda.require_cupy()

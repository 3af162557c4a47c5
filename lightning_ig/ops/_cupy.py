"""The CuPy loader, the one module that imports CuPy: find, compile and cache kernels, launch them on torch's stream.

It enforces the kernels' contract (``docs/ARCHITECTURE.md``): all memory is torch's (CuPy never allocates, so
``torch.cuda.graph`` can capture the launches); launches go to ``torch.cuda.current_stream(device)``, looked up at every
call (CuPy's wrapper of a stream cached by its handle); each ``.cu`` is compiled once per (device, options), prefixed
with ``#line 1 "<path>"`` so compiler errors name the real file; scalars are numpy scalars of the kernel's C type;
launches are CuPy's own (a hand-prepared ``cuLaunchKernel`` was no faster: ``docs/benchmarks.md``). CuPy is imported
lazily, so the package imports and runs (on its torch path) where CuPy is not installed.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from lightning_ig.vocabulary import BACKENDS, check_choice

__all__ = [
    "CUPY_INSTALL_HINT",
    "CupyImport",
    "choose_backend",
    "cupy_available",
    "current_stream_handle",
    "get_kernel",
    "int32",
    "int64",
    "kernel_dir",
    "kernel_source",
    "launch",
    "pointer",
    "require_cupy",
]

CUPY_INSTALL_HINT = (
    "install CuPy for your CUDA version: `pip install cupy-cuda12x` (CUDA 12) or `pip install cupy-cuda13x` "
    "(CUDA 13); in a clone of lightning-ig, `pip install -e '.[cuda12]'` or `'.[cuda13]'` does the same"
)


def _import_cupy(name: str) -> ModuleType:
    """``import cupy``, spelt out: the one import of CuPy in the package, where the import contract sees it."""
    assert name == "cupy"  # noqa: S101 - CupyImport asks for nothing else
    import cupy  # noqa: PLC0415 - on first use: the package imports and runs (on its torch path) without CuPy

    return cupy


class CupyImport:
    """CuPy, imported on first use (once, thread-safely); the error is kept when the import fails.

    Args:
        import_module: how ``cupy`` is imported (default: ``import cupy``; tests pass one that fails).
    """

    def __init__(self, import_module: Callable[[str], ModuleType] = _import_cupy) -> None:
        self._import_module = import_module
        self._lock = threading.Lock()
        self._module: ModuleType | None = None
        self.error: BaseException | None = None

    def module(self) -> ModuleType | None:
        """The ``cupy`` module, or ``None`` where it does not import."""
        if self._module is None and self.error is None:
            with self._lock:
                if self._module is None and self.error is None:
                    try:
                        self._module = self._import_module("cupy")
                    except Exception as error:  # noqa: BLE001 - ImportError, or a CUDA library that fails to load
                        self.error = error
        return self._module

    def require(self) -> ModuleType:
        """The ``cupy`` module, or a :class:`RuntimeError` that says how to install it."""
        if (module := self.module()) is None:
            raise RuntimeError(
                f"the CUDA backend needs CuPy, which failed to import ({self.error!r}); {CUPY_INSTALL_HINT}"
            )
        return module


_CUPY = CupyImport()


def cupy_available() -> bool:
    """Whether CuPy imports on this machine (it says nothing about a CUDA device)."""
    return _CUPY.module() is not None


def require_cupy() -> ModuleType:
    """Return the ``cupy`` module or raise a :class:`RuntimeError` that says how to install it.

    Raises:
        RuntimeError: CuPy is not installed or fails to import.
    """
    return _CUPY.require()


def kernel_dir() -> Path:
    """The folder holding the ``.cu`` sources.

    In an installed wheel the kernels travel inside the package (``lightning_ig/kernels``); in a source checkout or an
    editable install they are the repository's top-level ``kernels/`` folder.

    Raises:
        FileNotFoundError: neither location holds the kernels.
    """
    package = Path(__file__).resolve().parent.parent  # lightning_ig/
    for candidate in (package / "kernels", package.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(
        f"the CUDA kernel sources were not found next to {package} (looked in {package / 'kernels'} "
        f"and {package.parent / 'kernels'}); reinstall lightning-ig"
    )


def kernel_source(filename: str) -> str:
    """The source of ``kernels/<filename>`` with a ``#line`` directive so errors point at the file."""
    path = kernel_dir() / filename
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {filename!r} in {path.parent}")
    return f'#line 1 "{path.as_posix()}"\n' + path.read_text(encoding="utf-8")


@functools.cache
def _module(filename: str, device_index: int, options: tuple[str, ...]) -> Any:
    cupy, source = require_cupy(), kernel_source(filename)
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=source, options=("-std=c++17", f"-I{kernel_dir().as_posix()}", *options))
        module.compile()  # compile now, for this device, so errors surface here and not at launch
    return module


@functools.cache
def _kernel(filename: str, name: str, device_index: int, options: tuple[str, ...]) -> Any:
    return _module(filename, device_index, options).get_function(name)


def get_kernel(filename: str, name: str, device: torch.device | int, options: Sequence[str] = ()) -> Any:
    """The compiled kernel ``name`` from ``kernels/<filename>`` for ``device`` (cached).

    Args:
        filename: the ``.cu`` file inside ``kernels/``, e.g. ``"ig.cu"``.
        name: the ``extern "C"`` entry point, e.g. ``"ig_interpolate_f32"``.
        device: a CUDA device (or its index).
        options: extra NVRTC options (part of the cache key).
    """
    return _kernel(filename, name, _device_index(device), tuple(options))


@functools.lru_cache(maxsize=64)
def _external_stream(handle: int, device_index: int) -> Any:
    cupy = require_cupy()
    # CuPy 14 deprecates ExternalStream in favour of Stream.from_external(), which wants an object with __cuda_stream__;
    # a raw handle is all we keep, and the wrapper is built once per handle, so the warning is silenced here only.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cupy.cuda.ExternalStream(handle, device_index)


def _device_index(device: torch.device | int) -> int:
    if type(device) is int:
        return device  # a CUDA device index, as tensor.get_device() gives it
    if type(device) is torch.device and device.type == "cuda" and device.index is not None:
        return device.index  # the common case, without building a new torch.device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


def launch(
    kernel: Any,
    grid: int | tuple[int, ...],
    block: int | tuple[int, ...],
    args: Iterable[Any],
    *,
    device: torch.device | int,
    shared_mem: int = 0,
) -> None:
    """Launch ``kernel`` on torch's current stream of ``device``.

    Args:
        kernel: from :func:`get_kernel`.
        grid: blocks per grid (an int or a tuple of up to three).
        block: threads per block (an int or a tuple of up to three).
        args: kernel arguments: :func:`pointer` for tensors, :func:`int32` or
            :func:`int64` for integers, ``np.float32``/``np.float64`` for floating scalars.
        device: the CUDA device the tensors live on (or its index).
        shared_mem: dynamic shared memory in bytes.
    """
    index = _device_index(device)
    grid = grid if isinstance(grid, tuple) else (int(grid),)
    block = block if isinstance(block, tuple) else (int(block),)
    if any(g <= 0 for g in grid):
        return  # nothing to do; CUDA rejects empty grids
    cupy, cupy_stream = require_cupy(), _external_stream(current_stream_handle(index), index)
    # CuPy picks the kernel's per-device binary from the current device; entering
    # a Device context costs microseconds, so only do it when the device differs.
    if cupy.cuda.runtime.getDevice() == index:
        kernel(grid, block, tuple(args), stream=cupy_stream, shared_mem=shared_mem)
    else:
        with cupy.cuda.Device(index):
            kernel(grid, block, tuple(args), stream=cupy_stream, shared_mem=shared_mem)


def current_stream_handle(device_index: int) -> int:
    """The raw ``cudaStream_t`` of torch's current stream on ``device_index``.

    Looked up at every launch (never cached) so launches follow ``torch.cuda.stream`` contexts and CUDA-graph capture.
    """
    return torch.cuda.current_stream(device_index).cuda_stream


def pointer(tensor: torch.Tensor) -> np.uint64:
    """A tensor's device address as the 64-bit value a ``T*`` kernel parameter takes."""
    return np.uint64(tensor.data_ptr())


def int32(value: int) -> np.int32:
    """``value`` as a C ``int``; raises :class:`OverflowError` when it does not fit."""
    if not -(2**31) <= int(value) < 2**31:
        raise OverflowError(f"{value} does not fit a 32-bit kernel argument")
    return np.int32(value)


def int64(value: int) -> np.int64:
    """``value`` as a C ``long long``."""
    return np.int64(value)


def choose_backend(backend: str, *tensors: torch.Tensor) -> str:
    """The backend that will run, ``"cuda"`` or ``"torch"``, for ``"auto"``/``"cuda"``/``"torch"`` and the tensors.

    ``"auto"`` picks ``"cuda"`` when every tensor is on a CUDA device and CuPy
    imports, and ``"torch"`` otherwise. ``"cuda"`` never falls back silently.

    Raises:
        TypeError: ``backend`` is not a string.
        ValueError: an unknown backend name, or ``"cuda"`` with tensors off the GPU.
        RuntimeError: ``"cuda"`` where CuPy cannot be imported.
    """
    if backend == "torch":
        return "torch"
    if backend not in ("auto", "cuda"):  # the common names cost no call (this runs on every loss call)
        check_choice(backend, BACKENDS, "backend")
    # The common answer first, and cheaply (this runs on every loss call): Tensor.is_cuda
    # builds no torch.device, and cupy_available() reads a cached import.
    on_cuda = bool(tensors) and all(t.is_cuda for t in tensors)
    if on_cuda and cupy_available():
        return "cuda"
    if backend == "auto":
        return "torch"
    if not torch.cuda.is_available():
        raise ValueError("backend='cuda' needs a CUDA device, and torch sees none; use backend='auto' or 'torch'")
    if not on_cuda:
        where = sorted({str(t.device) for t in tensors}) or ["no tensors"]
        raise ValueError(
            f"backend='cuda' needs the tensors on a CUDA device, got {', '.join(where)}; move them with .cuda()"
        )
    require_cupy()
    return "cuda"

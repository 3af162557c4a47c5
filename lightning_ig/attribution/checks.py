"""The checks on tensors and torch objects every wing shares: states, finite values, devices, dtypes, generators.

The torch-free checks (names, numbers, paths) are :mod:`lightning_ig.vocabulary`; these need torch, so they live
beside the engine, whose inputs they mostly check. Errors say what was wrong, the value seen, and what to do.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lightning_ig.vocabulary import shown, shown_with_type

__all__ = ["check_dense", "check_device", "check_finite", "check_float_dtype", "check_generator", "check_states"]


def check_generator(value: Any, name: str = "generator") -> torch.Generator | None:
    """``None`` (torch's global generator) or a ``torch.Generator``."""
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"{name} must be None or a torch.Generator, got {shown_with_type(value)}")
    return value


def check_device(value: Any, name: str = "device") -> torch.device:
    """``value`` (a ``str`` such as ``"cuda:1"`` or a ``torch.device``) as a ``torch.device`` that exists here.

    Raises:
        TypeError: neither a str nor a torch.device.
        ValueError: not a device's name, the meta device (no values), or a CUDA device this machine lacks.
    """
    if not isinstance(value, (str, torch.device)):
        raise TypeError(
            f"{name} must be a str such as 'cpu' or 'cuda:0', or a torch.device, got {shown_with_type(value)}"
        )
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name} must name a device such as 'cpu', 'cuda' or 'cuda:1', got {shown(value)}") from None
    if device.type == "meta":
        raise ValueError(f"{name}={shown(value)}: the meta device holds shapes, not values; use 'cpu' or 'cuda'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={shown(value)}: torch sees no CUDA device here; use 'cpu'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{name}={shown(value)}: there are {torch.cuda.device_count()} CUDA devices here")
    return device


def check_float_dtype(value: Any, name: str = "dtype") -> torch.dtype:
    """``value`` if it is a floating-point ``torch.dtype``."""
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype such as torch.float32, got {shown_with_type(value)}")
    if not value.is_floating_point:
        raise ValueError(f"{name} must be a floating-point dtype (torch.float32, torch.float64, ...), got {value}")
    return value


def check_finite(name: str, tensor: Tensor, flag: Tensor | None = None) -> None:
    """Raise a ``ValueError`` naming ``name``, the count and the first index of NaN/Inf values.

    One host sync; the slow path (count and first index) runs only when something is wrong. ``flag`` is
    ``torch.isfinite(tensor).all()`` queued earlier, so that the sync finds it long done.
    """
    if bool(torch.isfinite(tensor).all() if flag is None else flag):
        return
    bad = ~torch.isfinite(tensor)
    count, first = int(bad.sum()), tuple(int(i) for i in bad.nonzero()[0])
    raise ValueError(
        f"{name} holds {count} NaN/Inf value(s), the first at index {first} (value {float(tensor[first])}); "
        f"IG needs finite {name}: clean or drop those states"
    )


def check_states(states: Any, name: str = "states") -> Tensor:
    """``states`` if it is a finite floating-point tensor ``(num_states >= 1, *feature_shape)`` with features.

    Raises:
        TypeError: not a tensor, or not floating point.
        ValueError: no state dimension, no states, no features (e.g. shape ``(5, 0)``), a sparse tensor or one on
            the meta device, or NaN/Inf.
    """
    if not isinstance(states, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (num_states, *feature_shape), got {type(states).__name__}")
    if states.ndim < 2 or states.shape[0] == 0 or math.prod(states.shape[1:]) == 0:
        raise ValueError(
            f"{name} must have shape (num_states >= 1, *feature_shape) with at least one feature, got "
            f"{tuple(states.shape)}"
            + ("; add the state dimension (states.unsqueeze(0)) for a single state" if states.ndim < 2 else "")
        )
    if not states.is_floating_point():
        raise TypeError(
            f"{name} must be floating point, got {states.dtype}: IG moves each feature along a line from the "
            "baseline; convert real-valued features with .float() (indices, as an nn.Embedding takes, have no "
            "gradient: attribute the embedded inputs, with a forward that takes them)"
        )
    check_dense(states, name)
    check_finite(name, states)
    return states


def check_dense(tensor: Tensor, name: str) -> None:
    """Refuse a sparse (or other non-strided) tensor and one on the meta device: neither has values to attribute.

    Raises:
        ValueError: ``tensor`` is not strided, or on the meta device.
    """
    if tensor.layout != torch.strided or tensor.is_meta:
        kind = "on the meta device (shapes without values)" if tensor.is_meta else f"a {tensor.layout} tensor"
        raise ValueError(f"{name} is {kind}; pass a dense tensor with values (.to_dense(), or make it on 'cpu')")

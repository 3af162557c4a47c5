"""The shared checks on tensors and torch objects: states, finite values, devices, dtypes and generators."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_ig.attribution.checks import (
    check_device,
    check_finite,
    check_float_dtype,
    check_generator,
    check_states,
)


def test_states_are_floating_point_with_a_state_dimension_and_features() -> None:
    states = torch.zeros(2, 3)
    assert check_states(states) is states
    assert check_states(torch.zeros(1, 2, 2), "frames").shape == (1, 2, 2)
    with pytest.raises(TypeError, match=r"states must be a torch.Tensor \(num_states, \*feature_shape\), got list"):
        check_states([[0.0]])
    with pytest.raises(
        TypeError, match=r"floating point, got torch.int64: .*real-valued features with .float\(\).*Embedding"
    ):
        check_states(torch.zeros(2, 3, dtype=torch.int64))
    for shape in ((3,), (0, 3), (5, 0)):
        with pytest.raises(
            ValueError, match="must have shape .num_states >= 1, .feature_shape. with at least one"
        ) as e:
            check_states(torch.zeros(shape))
        assert ("unsqueeze" in str(e.value)) == (len(shape) == 1), "the state dimension is advised only where missing"


def test_non_finite_values_are_counted_and_the_first_one_named() -> None:
    check_finite("inputs", torch.ones(3))
    values = torch.tensor([[1.0, math.nan], [math.inf, 2.0]])
    with pytest.raises(
        ValueError, match=r"inputs holds 2 NaN/Inf value\(s\), the first at index \(0, 1\) \(value nan\)"
    ):
        check_finite("inputs", values)
    check_finite("inputs", values, torch.tensor(True))  # a flag queued earlier is what is read
    with pytest.raises(ValueError, match="states holds 1 NaN/Inf value"):
        check_states(torch.tensor([[0.0, math.inf]]))


def test_devices_dtypes_and_generators() -> None:
    assert check_device("cpu") == torch.device("cpu") and check_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="device must name a device such as 'cpu', 'cuda' or 'cuda:1', got 'gpu0'"):
        check_device("gpu0")
    with pytest.raises(TypeError, match="device must be a str such as 'cpu' or 'cuda:0', or a torch.device"):
        check_device(0)
    assert check_float_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype"):
        check_float_dtype(torch.int32)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype such as torch.float32, got str"):
        check_float_dtype("float32")
    generator = torch.Generator()
    assert check_generator(generator) is generator and check_generator(None) is None
    with pytest.raises(TypeError, match="generator must be None or a torch.Generator, got int"):
        check_generator(7)


def test_meta_and_sparse_states_and_missing_devices_are_said_as_such() -> None:
    with pytest.raises(ValueError, match=r"states is on the meta device \(shapes without values\)"):
        check_states(torch.zeros(3, 4, device="meta"))
    with pytest.raises(ValueError, match="states is a torch.sparse_coo tensor; pass a dense tensor"):
        check_states(torch.zeros(3, 4).to_sparse())
    with pytest.raises(ValueError, match="the meta device holds shapes, not values"):
        check_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda': torch sees no CUDA device here; use 'cpu'"):
            check_device("cuda")

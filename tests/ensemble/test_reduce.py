"""The ensemble reduce's torch twin on the CPU: its values, gradients and checks.

Tolerances come from the dtype's eps and the size of the quantity (tests/support/tolerance.py):
the twin sums K sigmoids, then M weighted means in float32, so it is within
(K + M + a few) float32 roundings of sum_m |w_m| of the exact value, and the
output rounding (half an ulp of the output dtype) on top.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_ig.ensemble import (
    EnsembleReduce,
    ensemble_reduce,
    member_means,
)
from lightning_ig.ops import ensemble_reduce as ops
from tests.support.tolerance import assert_close_scaled

SHAPES = [(1, 1, 1), (3, 1, 5), (7, 3, 1), (16, 8, 1), (33, 5, 4), (10, 40, 3), (4, 64, 16), (0, 3, 2)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _data(shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(shape, generator=generator, dtype=torch.float64) * 4).to(dtype)
    weights = torch.randn(shape[1], generator=generator, dtype=torch.float64).to(torch.float32)
    return logits, weights


def _reference(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """float64 from the exact values of the inputs: what every backend approximates."""
    return (torch.sigmoid(logits.double()).mean(-1) * weights.double()).sum(-1)


def _ulps(shape: tuple[int, int, int]) -> int:
    return shape[2] + shape[1] + 8


# --------------------------------------------------------------------------- the twin's values


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_twin_matches_the_float64_reference(shape: tuple[int, int, int], dtype: torch.dtype) -> None:
    logits, weights = _data(shape, dtype)
    out = ensemble_reduce(logits, weights)
    assert out.shape == (shape[0],) and out.dtype == dtype
    expected = _reference(logits, weights)
    scale = float(weights.abs().sum())
    if dtype in (torch.float16, torch.bfloat16):  # the output rounding dominates: half an ulp of the dtype
        assert_close_scaled(out.double(), expected, ulps=1, dtype=dtype, scale=scale)
    else:
        accumulate = torch.float64 if dtype == torch.float64 else torch.float32
        assert_close_scaled(out.double(), expected, ulps=_ulps(shape), dtype=accumulate, scale=scale)


def test_twin_follows_the_kernels_documented_order() -> None:
    """numpy float32, one rounding per step, in the order kernels/ensemble.cu documents."""
    logits, weights = _data((6, 45, 3), torch.float32, seed=3)  # 45 members: 2 chunks of 32 lanes
    x = logits.numpy()
    e = torch.exp(-logits.abs()).numpy()  # exp is the one step numpy would round its own way: take torch's
    r = (np.float32(1) / (np.float32(1) + e)).astype(np.float32)
    sigmoid = np.where(x >= 0, r, e * r).astype(np.float32)
    expected = np.zeros(6, dtype=np.float32)
    lanes = ops.group_size(45)
    for row in range(6):
        partial = np.zeros(lanes, dtype=np.float32)
        for lane in range(lanes):
            for m in range(lane, 45, lanes):
                total = np.float32(0)
                for k in range(3):
                    total = np.float32(total + sigmoid[row, m, k])
                partial[lane] = np.float32(
                    partial[lane] + np.float32(weights.numpy()[m] * np.float32(total / np.float32(3)))
                )
        width = lanes
        while width > 1:
            width //= 2
            partial[:width] = (partial[:width] + partial[width : 2 * width]).astype(np.float32)
        expected[row] = partial[0]
    out = ensemble_reduce(logits, weights, backend="torch")
    np.testing.assert_array_equal(out.numpy().view(np.int32), expected.view(np.int32))


def test_extreme_logits_are_exact_and_nan_stays_in_its_row() -> None:
    logits = torch.tensor(
        [
            [[1e4, -1e4], [math.inf, -math.inf]],
            [[1e30, 1e30], [-1e30, -1e30]],
            [[0.0, 0.0], [-100.0, 100.0]],
            [[math.nan, 0.0], [0.0, 0.0]],
        ]
    )
    weights = torch.tensor([1.0, 2.0])
    out = ensemble_reduce(logits, weights)
    assert out[:3].tolist() == [0.5 + 1.0, 1.0, 0.5 + 2.0 * (0.5 + 0.5 * float(torch.sigmoid(torch.tensor(-100.0))))]
    assert math.isnan(out[3])
    leaf = logits[:3].clone().requires_grad_()
    ensemble_reduce(leaf, weights).sum().backward()
    assert torch.isfinite(leaf.grad).all() and leaf.grad[:2].abs().max() == 0  # saturated: no gradient


def test_reduce_dim_one_reads_members_last_and_strided_views_match() -> None:
    logits, weights = _data((9, 6, 4), torch.float32, seed=1)
    expected = ensemble_reduce(logits, weights)
    members_last = logits.transpose(1, 2).contiguous()  # (B, K, M)
    assert torch.equal(ensemble_reduce(members_last, weights, reduce_dim=1), expected)
    assert torch.equal(ensemble_reduce(members_last, weights, reduce_dim=-2), expected)
    wide = torch.zeros(9, 6, 8)
    wide[..., ::2] = logits  # a non-contiguous K axis
    assert torch.equal(ensemble_reduce(wide[..., ::2], weights), expected)


def test_member_means_are_the_members_mean_sigmoid() -> None:
    logits, weights = _data((5, 4, 3), torch.float32, seed=2)
    means = member_means(logits)
    assert means.shape == (5, 4) and means.dtype == torch.float32
    assert_close_scaled(means.double(), torch.sigmoid(logits.double()).mean(-1), ulps=8)
    assert_close_scaled(
        ensemble_reduce(logits, weights), means.double() @ weights.double(), ulps=16, scale=float(weights.abs().sum())
    )


def test_float32_weights_and_float64_weights_read_alike() -> None:
    logits, weights = _data((4, 3, 2), torch.float32)
    assert torch.equal(ensemble_reduce(logits, weights.double()), ensemble_reduce(logits, weights))


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("reduce_dim", [-1, 1])
def test_gradcheck_in_float64(reduce_dim: int) -> None:
    logits, weights = _data((5, 3, 4), torch.float64, seed=4)
    logits = logits.double().requires_grad_()
    weights = weights.double().requires_grad_()
    view = logits if reduce_dim == -1 else logits.transpose(1, 2)

    def function(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ensemble_reduce(a if reduce_dim == -1 else a.transpose(1, 2), w, reduce_dim=reduce_dim)

    assert torch.autograd.gradcheck(function, (logits, weights))
    assert torch.autograd.gradgradcheck(function, (logits, weights))
    del view


@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)], ids=["both", "logits", "weights"])
def test_float32_gradients_not_the_last_op(needs: tuple[bool, bool]) -> None:
    logits, weights = _data((12, 7, 3), torch.float32, seed=5)
    logits.requires_grad_(needs[0])
    weights.requires_grad_(needs[1])
    scale = torch.linspace(-2.0, 3.0, 12)  # grad_output != 1
    (ensemble_reduce(logits, weights) * scale).sum().backward()
    exact_logits = logits.detach().double().requires_grad_()
    exact_weights = weights.detach().double().requires_grad_()
    (_reference(exact_logits, exact_weights) * scale.double()).sum().backward()
    if needs[0]:
        assert_close_scaled(logits.grad.double(), exact_logits.grad, ulps=8, scale=float(exact_logits.grad.abs().max()))
    if needs[1]:
        # a sum over 12 rows of products of float32 values, in float64 then rounded once
        assert_close_scaled(
            weights.grad.double(), exact_weights.grad, ulps=16, scale=float(exact_weights.grad.abs().max())
        )


def test_no_graph_is_built_without_a_gradient() -> None:
    logits, weights = _data((3, 2, 2), torch.float32)
    assert ensemble_reduce(logits, weights).grad_fn is None
    with torch.no_grad():
        assert ensemble_reduce(logits.requires_grad_(), weights).grad_fn is None


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("logits", "weights", "options", "error", "words"),
    [
        ([[[0.0]]], torch.ones(1), {}, TypeError, "logits must be a torch.Tensor"),
        (
            torch.zeros(2, 3, 4, dtype=torch.int64),
            torch.ones(3),
            {},
            TypeError,
            "logits must be floating point, got torch.int64",
        ),
        (torch.zeros(2, 3), torch.ones(3), {}, ValueError, r"logits must be 3-D .* got shape \(2, 3\)"),
        (torch.zeros(2, 0, 4), torch.ones(0), {}, ValueError, "hold 0 member"),
        (torch.zeros(2, 3, 0), torch.ones(3), {}, ValueError, "with 0 logit"),
        (torch.zeros(2, 3, 4), torch.ones(4), {}, ValueError, r"weights must have shape \(3,\).* got shape \(4,\)"),
        (torch.zeros(2, 3, 4), torch.ones(1, 3), {}, ValueError, r"got shape \(1, 3\)"),
        (
            torch.zeros(2, 3, 4),
            torch.ones(3, dtype=torch.int32),
            {},
            TypeError,
            "weights must be floating point, got torch.int32",
        ),
        (torch.zeros(2, 3, 4), [1.0, 1.0, 1.0], {}, TypeError, r"weights must be a torch.Tensor of shape \(3,\)"),
        (
            torch.zeros(2, 3, 4),
            torch.tensor([1.0, math.nan, 1.0]),
            {},
            ValueError,
            "weights must be finite, got nan at index 1",
        ),
        (torch.zeros(2, 3, 4), torch.tensor([1.0, 1.0, -math.inf]), {}, ValueError, "got -inf at index 2"),
        (torch.zeros(2, 3, 4), torch.ones(3), {"reduce_dim": 0}, ValueError, "reduce_dim names the axis .* got 0"),
        (torch.zeros(2, 3, 4), torch.ones(3), {"reduce_dim": 1.0}, TypeError, "reduce_dim must be an int"),
        (torch.zeros(2, 3, 4), torch.ones(3), {"reduce_dim": 1}, ValueError, r"weights must have shape \(4,\)"),
        (
            torch.zeros(2, 3, 4),
            torch.ones(3),
            {"backend": "triton"},
            ValueError,
            "backend must be one of 'auto', 'cuda', 'torch'",
        ),
    ],
)
def test_bad_input_is_one_clear_error(logits, weights, options, error, words) -> None:
    with pytest.raises(error, match=words):
        ensemble_reduce(logits, weights, **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_backend_without_a_device_never_falls_back() -> None:
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA device"):
        ensemble_reduce(torch.zeros(2, 3, 4), torch.ones(3), backend="cuda")


def test_modules_check_weights_when_they_are_set() -> None:
    reduce = EnsembleReduce(4)
    assert reduce.weights.tolist() == [0.25] * 4 and not reduce.weights.requires_grad
    assert "num_members=4" in repr(reduce)
    with pytest.raises(ValueError, match="weights must be finite"):
        EnsembleReduce([1.0, math.inf])
    with pytest.raises(ValueError, match="at least one"):
        EnsembleReduce([])
    with pytest.raises(ValueError, match="member count must be >= 1"):
        EnsembleReduce(0)
    with pytest.raises(TypeError, match="weights must be numbers"):
        EnsembleReduce(["a", "b"])
    with pytest.raises(ValueError, match="reduce_dim names"):
        EnsembleReduce(2, reduce_dim=3)
    with pytest.raises(ValueError, match="weights must be finite, got nan"):
        reduce.load_state_dict({"weights": torch.tensor([0.5, math.nan, 0.0, 0.5])})
    learnable = EnsembleReduce([0.5, 0.5], learnable=True)
    learnable(torch.randn(3, 2, 2)).sum().backward()
    assert learnable.weights.grad is not None and learnable.weights.grad.shape == (2,)


# --------------------------------------------------------------------------- the Ensemble target

"""NoisyLinear: factorised Gaussian noise (Fortunato et al.), drawn only by reset_noise and applied only in training."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from lightning_ig.models.noise import NoisyLinear


def _f(x: torch.Tensor) -> torch.Tensor:
    return x.sign() * x.abs().sqrt()


def test_initialisation_follows_fortunato() -> None:
    torch.manual_seed(0)
    layer = NoisyLinear(16, 5, sigma0=0.4)
    bound = 1 / math.sqrt(16)
    assert layer.weight_mu.abs().max() <= bound and layer.bias_mu.abs().max() <= bound
    # the uniform init spreads over most of its range, it is not a constant
    assert layer.weight_mu.max() - layer.weight_mu.min() > bound
    torch.testing.assert_close(layer.weight_sigma, torch.full((5, 16), 0.4 / 4.0))
    torch.testing.assert_close(layer.bias_sigma, torch.full((5,), 0.4 / 4.0))


def test_noise_is_factorised_and_drawn_from_the_given_generator() -> None:
    layer = NoisyLinear(6, 3)
    global_state = torch.get_rng_state()
    layer.reset_noise(torch.Generator().manual_seed(123))
    assert torch.equal(torch.get_rng_state(), global_state), "a private generator must leave the global one alone"
    reference = torch.Generator().manual_seed(123)
    e_in, e_out = torch.randn(6, generator=reference), torch.randn(3, generator=reference)
    torch.testing.assert_close(layer.weight_epsilon, torch.outer(_f(e_out), _f(e_in)), rtol=0, atol=0)
    torch.testing.assert_close(layer.bias_epsilon, _f(e_out), rtol=0, atol=0)
    assert torch.linalg.matrix_rank(layer.weight_epsilon) == 1


def test_noise_applies_only_in_training_mode_with_noise_enabled() -> None:
    torch.manual_seed(1)
    layer = NoisyLinear(4, 3)
    x = torch.randn(8, 4)
    mean_output = F.linear(x, layer.weight_mu, layer.bias_mu)
    noisy_output = F.linear(
        x,
        layer.weight_mu + layer.weight_sigma * layer.weight_epsilon,
        layer.bias_mu + layer.bias_sigma * layer.bias_epsilon,
    )
    assert layer.noise_active
    torch.testing.assert_close(layer(x), noisy_output)
    assert not torch.allclose(layer(x), mean_output)
    layer.eval()
    torch.testing.assert_close(layer(x), mean_output, rtol=0, atol=0)
    layer.train()
    layer.disable_noise()
    assert not layer.noise_enabled and not layer.noise_active
    torch.testing.assert_close(layer(x), mean_output, rtol=0, atol=0)
    layer.enable_noise()
    torch.testing.assert_close(layer(x), noisy_output)


def test_forward_draws_no_random_numbers_and_gradients_reach_mu_and_sigma() -> None:
    layer = NoisyLinear(3, 2, bias=False)
    assert layer.bias_epsilon is None and "bias=False" in repr(layer)
    state = torch.get_rng_state()
    layer(torch.ones(2, 3)).sum().backward()
    assert torch.equal(torch.get_rng_state(), state)
    assert layer.weight_mu.grad is not None and layer.weight_sigma.grad is not None
    assert layer.weight_sigma.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"in_features": 0, "out_features": 2}, ValueError, "in_features"),
        ({"in_features": 2.0, "out_features": 2}, TypeError, "in_features"),
        ({"in_features": 2, "out_features": -1}, ValueError, "out_features"),
        ({"in_features": 2, "out_features": 2, "sigma0": -0.1}, ValueError, "sigma0"),
        ({"in_features": 2, "out_features": 2, "sigma0": float("nan")}, ValueError, "sigma0"),
        ({"in_features": 2, "out_features": 2, "bias": 1}, TypeError, "bias"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        NoisyLinear(**kwargs)


def test_a_numpy_float_sigma0_is_taken_as_its_value() -> None:
    layer = NoisyLinear(4, 2, sigma0=np.float32(0.5))  # refused as "not >= 0" before
    assert layer.sigma0 == 0.5 and torch.all(layer.weight_sigma == 0.25)


@pytest.mark.parametrize("bias", [True, False])
def test_meta_build_then_to_empty_and_reset_parameters_initialises_the_noise_too(bias: bool) -> None:
    # torch's deferred initialisation (FSDP's default, skip_init): build on meta, to_empty, then reset_parameters().
    # to_empty leaves the epsilon buffers as uninitialised memory, which the training-mode forward would add.
    torch.manual_seed(3)
    eager = NoisyLinear(5, 3, bias=bias)
    with torch.device("meta"):
        deferred = NoisyLinear(5, 3, bias=bias)
    deferred.to_empty(device="cpu")
    for buffer in deferred.buffers():
        buffer.fill_(float("nan"))  # what uninitialised memory may hold
    torch.manual_seed(3)
    deferred.reset_parameters()
    for key, value in eager.state_dict().items():
        assert torch.equal(deferred.state_dict()[key], value), key
    x = torch.randn(2, 5)
    assert torch.equal(deferred(x), eager(x))

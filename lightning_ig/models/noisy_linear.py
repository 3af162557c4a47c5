"""This package's NoisyNet layer: :class:`NoisyLinear`, the factorised Gaussian layer of Fortunato et al., "Noisy
Networks for Exploration" (ICLR 2018); switching its noise off for attribution is :mod:`.noise`'s job.

``y = (mu_w + sigma_w * eps_w) x + (mu_b + sigma_b * eps_b)``, ``eps_w = f(e_out) outer f(e_in)``, ``eps_b =
f(e_out)``, ``f(x) = sign(x) sqrt(|x|)``: ``in + out`` standard normals per :meth:`NoisyLinear.reset_noise`.
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_ig.attribution.checks import check_generator
from lightning_ig.vocabulary import check_bool, check_positive_int

__all__ = ["BEFORE_NOISE_WRITE", "NoisyLinear", "check_sigma0"]

# NoisyLinear -> the copy-once callbacks of the noise_disabled blocks open around it (innermost last). This package's
# layers change their noise only in reset_noise, so a block copies their buffers only when that is called: nothing
# is copied on the path a run takes (a Nature-CNN's two epsilon matrices are 6.4 MB a run otherwise).
BEFORE_NOISE_WRITE: weakref.WeakKeyDictionary[nn.Module, list[Callable[[], None]]] = weakref.WeakKeyDictionary()


def _scale_noise(noise: Tensor) -> Tensor:
    """``f(x) = sign(x) sqrt(|x|)``, the factorised-noise transform."""
    return noise.sign() * noise.abs().sqrt()


def check_sigma0(sigma0: Any) -> float:
    """``sigma0`` as a float: a finite real number >= 0 (numpy's too: ``np.float32`` is no ``float``).

    Raises:
        ValueError: anything else (a bool, a string, NaN, a negative number).
    """
    value = float(sigma0) if isinstance(sigma0, numbers.Real) and not isinstance(sigma0, bool) else math.nan
    if math.isfinite(value) and value >= 0:
        return value
    raise ValueError(f"sigma0 must be a finite number >= 0, got {sigma0!r}; Fortunato et al. use 0.5")


class NoisyLinear(nn.Module):
    """A linear layer with learnt, factorised Gaussian noise on its weights and bias.

    The noise is used only while the layer is in training mode **and** its noise is enabled; in eval mode, or after
    :meth:`disable_noise`, the layer computes with the mean weights ``mu`` (the NoisyNet convention for evaluation). The
    current epsilon lives in the buffers ``weight_epsilon`` ``(out_features, in_features)`` and ``bias_epsilon``
    ``(out_features,)``, drawn again only by :meth:`reset_noise`, never by ``forward``.

    Args:
        in_features: Size of each input sample, ``>= 1``.
        out_features: Size of each output sample, ``>= 1``.
        sigma0: Initial noise scale; ``sigma`` starts at ``sigma0 / sqrt(in_features)``
            (Fortunato et al. use 0.5). Default ``0.5``. Must be ``>= 0``.
        bias: Whether the layer has a (noisy) bias. Default ``True``.

    Raises:
        TypeError: If ``in_features``/``out_features`` are not ints or ``bias`` is not a bool.
        ValueError: If a size is below 1 or ``sigma0`` is negative or not finite.

    Example::

        >>> layer = NoisyLinear(4, 2)
        >>> layer.reset_noise(torch.Generator().manual_seed(0))
        >>> from lightning_ig import noise_disabled
        >>> with noise_disabled(layer):
        ...     y = layer(torch.ones(3, 4))  # mean weights, deterministic
        >>> y.shape
        torch.Size([3, 2])
    """

    weight_epsilon: Tensor
    bias_epsilon: Tensor | None

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        in_features = check_positive_int(in_features, "in_features")
        out_features = check_positive_int(out_features, "out_features")
        sigma0 = check_sigma0(sigma0)
        check_bool(bias, "bias")
        self.in_features, self.out_features, self.sigma0 = in_features, out_features, sigma0
        self._noise_enabled = True

        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.register_buffer("weight_epsilon", torch.zeros(out_features, in_features))
        if bias:
            self.bias_mu: nn.Parameter | None = nn.Parameter(torch.empty(out_features))
            self.bias_sigma: nn.Parameter | None = nn.Parameter(torch.empty(out_features))
            self.register_buffer("bias_epsilon", torch.zeros(out_features))
        else:
            self.register_parameter("bias_mu", None)
            self.register_parameter("bias_sigma", None)
            self.register_buffer("bias_epsilon", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise as in Fortunato et al. (factorised case), then draw the noise (:meth:`reset_noise`).

        ``mu ~ U(-1/sqrt(in), 1/sqrt(in))`` and ``sigma = sigma0 / sqrt(in)`` for the weights and the bias alike. The
        epsilon buffers are drawn too, as torch asks of ``reset_parameters`` (``to_empty`` leaves them uninitialised).
        """
        bound, sigma = 1.0 / math.sqrt(self.in_features), self.sigma0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound)
            self.weight_sigma.fill_(sigma)
            if self.bias_mu is not None and self.bias_sigma is not None:
                self.bias_mu.uniform_(-bound, bound)
                self.bias_sigma.fill_(sigma)
        self.reset_noise()

    @torch.no_grad()
    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Draw a new epsilon: ``in_features + out_features`` standard normals.

        Args:
            generator: Where the random numbers come from; default ``None`` uses torch's global generator for the
                layer's device (as ``nn.Linear``'s initialisation does). Pass your own generator to keep the global
                stream untouched. It must live on the layer's device.
        """
        for keep in BEFORE_NOISE_WRITE.get(self, ()):
            keep()  # a noise_disabled block around this call copies the old noise now, to put it back on exit
        device, dtype = self.weight_mu.device, self.weight_mu.dtype
        generator = check_generator(generator)
        if generator is not None and generator.device.type != device.type:
            raise ValueError(f"generator is on {generator.device} but the layer is on {device}; make one on {device}")
        noise_in = _scale_noise(torch.randn(self.in_features, generator=generator, device=device, dtype=dtype))
        noise_out = _scale_noise(torch.randn(self.out_features, generator=generator, device=device, dtype=dtype))
        # eps_w[j, i] = f(e_out[j]) f(e_in[i]): (out_features, in_features)
        self.weight_epsilon.copy_(torch.outer(noise_out, noise_in))
        if self.bias_epsilon is not None:
            self.bias_epsilon.copy_(noise_out)

    def disable_noise(self) -> None:
        """Compute with the mean weights from now on, in any mode."""
        self._noise_enabled = False

    def enable_noise(self) -> None:
        """Use the noise again whenever the layer is in training mode."""
        self._noise_enabled = True

    @property
    def noise_enabled(self) -> bool:
        """Whether the noise is switched on (it is applied only in training mode)."""
        return self._noise_enabled

    @property
    def noise_active(self) -> bool:
        """Whether ``forward`` uses the noise right now (noise enabled and training mode)."""
        return self._noise_enabled and self.training

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        """The weight and bias ``forward`` uses right now."""
        if self.noise_active:
            weight = self.weight_mu + self.weight_sigma * self.weight_epsilon
            bias = None
            if self.bias_mu is not None and self.bias_sigma is not None and self.bias_epsilon is not None:
                bias = self.bias_mu + self.bias_sigma * self.bias_epsilon
            return weight, bias
        return self.weight_mu, self.bias_mu

    def forward(self, x: Tensor) -> Tensor:
        """``(..., in_features) -> (..., out_features)``."""
        return F.linear(x, *self.effective_weight())

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, sigma0={self.sigma0}, "
            f"bias={self.bias_mu is not None}, noise_enabled={self._noise_enabled}"
        )

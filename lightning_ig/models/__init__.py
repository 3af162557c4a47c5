"""The models' wing: Q-networks, NoisyNet layers and switching their noise off, the architecture registry.

* :mod:`~lightning_ig.models.networks`: :class:`DuelingQNetwork` (MLP), :class:`ConvDuelingQNetwork`,
  :class:`MinAtarQNetwork`, :class:`NatureQNetwork` (CNNs), all dueling, with optional NoisyNet streams.
* :mod:`~lightning_ig.models.noise`: :class:`NoisyLinear`, :func:`noise_disabled` (any NoisyNet layer's noise
  off, put back after) and :func:`attribution_mode` (eval mode, noise off, random generators restored: what an
  attribution during training runs inside).
* :mod:`~lightning_ig.models.registry`: :func:`register_model`, :func:`build_model` and :func:`resolve_model_class`: the
  names a checkpoint records for its architecture; an import path is followed only on the caller's say-so.

A new network goes in :mod:`~lightning_ig.models.networks`, registered under its name, with a ``config()``
returning its constructor's keyword arguments and a constructor that checks them (a checkpoint's config is data).
"""

from lightning_ig.models.networks import (
    ACTIVATIONS,
    ConvDuelingQNetwork,
    DuelingQNetwork,
    MinAtarQNetwork,
    NatureQNetwork,
)
from lightning_ig.models.noise import NoisyLinear, attribution_mode, is_noisy_layer, noise_disabled
from lightning_ig.models.registry import (
    UnregisteredModelError,
    build_model,
    model_config,
    model_name,
    register_model,
    resolve_model_class,
)

__all__ = [
    "ACTIVATIONS",
    "ConvDuelingQNetwork",
    "DuelingQNetwork",
    "MinAtarQNetwork",
    "NatureQNetwork",
    "NoisyLinear",
    "UnregisteredModelError",
    "attribution_mode",
    "build_model",
    "is_noisy_layer",
    "model_config",
    "model_name",
    "noise_disabled",
    "register_model",
    "resolve_model_class",
]

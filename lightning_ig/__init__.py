"""lightning-ig: training-time Integrated Gradients for PyTorch Lightning.

What a user imports, nothing else: the callback, the IG engine and its result, feature groups, the dueling
Q-network and its noise, the fused loss, checkpoints. Every other public name lives in its wing, which
says what it exports in its docstring:

* :mod:`lightning_ig.attribution`: the engine (``IGOptions``, the callback's ``engine=``; ``StochasticForwardWarning``,
  ``target_forward``, ...);
* :mod:`lightning_ig.models`: the other Q-networks (``ConvDuelingQNetwork``, ``MinAtarQNetwork``,
  ``NatureQNetwork``), ``register_model``, ``build_model``;
* :mod:`lightning_ig.run`: a run's numbers (``HostResult``, ``accuracy_verdict``, ...);
* :mod:`lightning_ig.views`: ``ViewOptions`` (the callback's ``views=``), the JSON report (``build_report``,
  ``feature_statistics``, ...);
  :mod:`lightning_ig.checkpoint`: merged files and states files; :mod:`lightning_ig.trust`: the trust checks.

Names are imported on first use, so ``import lightning_ig`` stays cheap: it loads neither torch nor Lightning,
TensorBoard or Pillow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_ig._version import __version__

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "IntegratedGradientsCallback": "lightning_ig.callback",
    "NonFiniteAttributionError": "lightning_ig.callback",
    "integrated_gradients": "lightning_ig.attribution",
    "IntegratedGradients": "lightning_ig.attribution",
    "IGResult": "lightning_ig.attribution",
    "FeatureGroups": "lightning_ig.attribution.groups",
    "DuelingQNetwork": "lightning_ig.models",
    "NoisyLinear": "lightning_ig.models",
    "noise_disabled": "lightning_ig.models",
    "SoftMarginLoss": "lightning_ig.losses",
    "soft_margin_loss": "lightning_ig.losses",
    "swap_soft_margin": "lightning_ig.losses",
    "save_checkpoint": "lightning_ig.checkpoint",
    "load_checkpoint": "lightning_ig.checkpoint",
}

__all__ = [
    "DuelingQNetwork",
    "FeatureGroups",
    "IGResult",
    "IntegratedGradients",
    "IntegratedGradientsCallback",
    "NoisyLinear",
    "NonFiniteAttributionError",
    "SoftMarginLoss",
    "__version__",
    "integrated_gradients",
    "load_checkpoint",
    "noise_disabled",
    "save_checkpoint",
    "soft_margin_loss",
    "swap_soft_margin",
]


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs, which do not run __getattr__
    from lightning_ig.attribution import IGResult, IntegratedGradients, integrated_gradients
    from lightning_ig.attribution.groups import FeatureGroups
    from lightning_ig.callback import IntegratedGradientsCallback, NonFiniteAttributionError
    from lightning_ig.checkpoint import load_checkpoint, save_checkpoint
    from lightning_ig.losses import SoftMarginLoss, soft_margin_loss, swap_soft_margin
    from lightning_ig.models import DuelingQNetwork, NoisyLinear, noise_disabled
else:  # a module __getattr__ that type checkers saw would type any other name as Any: a misspelt import passed

    def __getattr__(name: str) -> Any:
        if (module_name := _EXPORTS.get(name)) is None:
            raise AttributeError(f"module 'lightning_ig' has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value  # later look-ups skip this function
        return value

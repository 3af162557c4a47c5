"""lightning-ig: training-time Integrated Gradients for PyTorch Lightning.

What a user imports, nothing else: the callback, the IG engine, the fused loss, ensembles, the Q-networks and
their noise, checkpoints. Every other public name lives in its wing (``lightning_ig.attribution``,
``lightning_ig.views``, ``lightning_ig.checkpoint``, ...; docs/ARCHITECTURE.md maps them). Names are imported on
first use, so ``import lightning_ig`` stays cheap: it loads neither torch nor Lightning, TensorBoard or Pillow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_ig._version import __version__

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # the callback
    "IntegratedGradientsCallback": "lightning_ig.callback",
    "NonFiniteAttributionError": "lightning_ig.callback",
    # the engine and what it returns
    "integrated_gradients": "lightning_ig.attribution",
    "IntegratedGradients": "lightning_ig.attribution",
    "IGResult": "lightning_ig.attribution",
    "StochasticForwardWarning": "lightning_ig.attribution",
    "target_forward": "lightning_ig.attribution",
    "FeatureGroups": "lightning_ig.attribution.groups",
    "feature_statistics": "lightning_ig.views.report_rows",
    # models and their noise
    "DuelingQNetwork": "lightning_ig.models",
    "ConvDuelingQNetwork": "lightning_ig.models",
    "MinAtarQNetwork": "lightning_ig.models",
    "NatureQNetwork": "lightning_ig.models",
    "NoisyLinear": "lightning_ig.models",
    "noise_disabled": "lightning_ig.models",
    "register_model": "lightning_ig.models",
    # the fused loss
    "soft_margin_loss": "lightning_ig.losses",
    "SoftMarginLoss": "lightning_ig.losses",
    "swap_soft_margin": "lightning_ig.losses",
    # ensembles
    "Ensemble": "lightning_ig.ensemble",
    "EnsembleReduce": "lightning_ig.ensemble",
    "ensemble_reduce": "lightning_ig.ensemble",
    "ensemble_summary": "lightning_ig.run.agreement",
    # checkpoints
    "save_checkpoint": "lightning_ig.checkpoint",
    "load_checkpoint": "lightning_ig.checkpoint",
}

__all__ = [
    "ConvDuelingQNetwork",
    "DuelingQNetwork",
    "Ensemble",
    "EnsembleReduce",
    "FeatureGroups",
    "IGResult",
    "IntegratedGradients",
    "IntegratedGradientsCallback",
    "MinAtarQNetwork",
    "NatureQNetwork",
    "NoisyLinear",
    "NonFiniteAttributionError",
    "SoftMarginLoss",
    "StochasticForwardWarning",
    "__version__",
    "ensemble_reduce",
    "ensemble_summary",
    "feature_statistics",
    "integrated_gradients",
    "load_checkpoint",
    "noise_disabled",
    "register_model",
    "save_checkpoint",
    "soft_margin_loss",
    "swap_soft_margin",
    "target_forward",
]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is not None:
        value = getattr(importlib.import_module(module_name), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'lightning_ig' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs, which do not run __getattr__
    from lightning_ig.attribution import (
        IGResult,
        IntegratedGradients,
        StochasticForwardWarning,
        integrated_gradients,
        target_forward,
    )
    from lightning_ig.attribution.groups import FeatureGroups
    from lightning_ig.callback import IntegratedGradientsCallback, NonFiniteAttributionError
    from lightning_ig.checkpoint import load_checkpoint, save_checkpoint
    from lightning_ig.ensemble import Ensemble, EnsembleReduce, ensemble_reduce
    from lightning_ig.losses import SoftMarginLoss, soft_margin_loss, swap_soft_margin
    from lightning_ig.models import (
        ConvDuelingQNetwork,
        DuelingQNetwork,
        MinAtarQNetwork,
        NatureQNetwork,
        NoisyLinear,
        noise_disabled,
        register_model,
    )
    from lightning_ig.run.agreement import ensemble_summary
    from lightning_ig.views.report_rows import feature_statistics

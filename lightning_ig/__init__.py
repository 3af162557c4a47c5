"""lightning-ig: training-time Integrated Gradients for PyTorch Lightning.

The public API, nothing else. Names are imported on first use so that
``import lightning_ig`` stays cheap (the engine does not pull in Lightning,
TensorBoard or Pillow until a part that needs them is used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # the engine
    "integrated_gradients": "lightning_ig.attribution",
    "IGResult": "lightning_ig.attribution",
    "IntegratedGradients": "lightning_ig.attribution",
    "target_forward": "lightning_ig.attribution",
    "StochasticForwardWarning": "lightning_ig.attribution",
    "quadrature": "lightning_ig.quadrature",
    # noise
    "NoisyLinear": "lightning_ig.noise",
    "noise_disabled": "lightning_ig.noise",
    # the callback and what it produces
    "IntegratedGradientsCallback": "lightning_ig.callback",
    "NonFiniteAttributionError": "lightning_ig.callback",
    "build_report": "lightning_ig.report",
    "feature_statistics": "lightning_ig.report",
    "completeness_summary": "lightning_ig.report",
    "FeatureGroups": "lightning_ig.groups",
    "SCHEMA_VERSION": "lightning_ig.report",
    # the fused loss
    "soft_margin_loss": "lightning_ig.losses",
    "SoftMarginLoss": "lightning_ig.losses",
    "swap_soft_margin": "lightning_ig.losses",
    # ensembles
    "ensemble_reduce": "lightning_ig.ensemble",
    "EnsembleReduce": "lightning_ig.ensemble",
    "Ensemble": "lightning_ig.ensemble",
    "ensemble_summary": "lightning_ig.ensemble",
    # checkpoints and models
    "save_checkpoint": "lightning_ig.checkpoint",
    "load_checkpoint": "lightning_ig.checkpoint",
    "LoadedCheckpoint": "lightning_ig.checkpoint",
    "list_heads": "lightning_ig.checkpoint",
    "load_states": "lightning_ig.checkpoint",
    "save_merged_checkpoint": "lightning_ig.checkpoint",
    "DuelingQNetwork": "lightning_ig.models",
    "ConvDuelingQNetwork": "lightning_ig.models",
    "MinAtarQNetwork": "lightning_ig.models",
    "NatureQNetwork": "lightning_ig.models",
    "register_model": "lightning_ig.models",
    "build_model": "lightning_ig.models",
}

__all__ = [
    "SCHEMA_VERSION",
    "ConvDuelingQNetwork",
    "DuelingQNetwork",
    "Ensemble",
    "EnsembleReduce",
    "FeatureGroups",
    "IGResult",
    "IntegratedGradients",
    "IntegratedGradientsCallback",
    "LoadedCheckpoint",
    "MinAtarQNetwork",
    "NatureQNetwork",
    "NoisyLinear",
    "NonFiniteAttributionError",
    "SoftMarginLoss",
    "StochasticForwardWarning",
    "__version__",
    "build_model",
    "build_report",
    "completeness_summary",
    "ensemble_reduce",
    "ensemble_summary",
    "feature_statistics",
    "integrated_gradients",
    "list_heads",
    "load_checkpoint",
    "load_states",
    "noise_disabled",
    "quadrature",
    "register_model",
    "save_checkpoint",
    "save_merged_checkpoint",
    "soft_margin_loss",
    "swap_soft_margin",
    "target_forward",
]

assert set(__all__) == {"__version__", *_EXPORTS}  # noqa: S101 - the two lists in step, at import

# ``quadrature`` names both a submodule and the public function in it. The first import of the submodule (the
# engine's, say) binds the package's attribute to the module, after which ``lightning_ig.quadrature`` would be
# the module; loading it here, before anything else can, and binding the function after keeps the function.
from lightning_ig import quadrature as _rules  # noqa: E402 - numpy only

quadrature = _rules.quadrature


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'lightning_ig' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later look-ups skip this function
    return value


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
    from lightning_ig.callback import IntegratedGradientsCallback, NonFiniteAttributionError
    from lightning_ig.checkpoint import (
        LoadedCheckpoint,
        list_heads,
        load_checkpoint,
        load_states,
        save_checkpoint,
        save_merged_checkpoint,
    )
    from lightning_ig.ensemble import Ensemble, EnsembleReduce, ensemble_reduce, ensemble_summary
    from lightning_ig.groups import FeatureGroups
    from lightning_ig.losses import SoftMarginLoss, soft_margin_loss, swap_soft_margin
    from lightning_ig.models import (
        ConvDuelingQNetwork,
        DuelingQNetwork,
        MinAtarQNetwork,
        NatureQNetwork,
        build_model,
        register_model,
    )
    from lightning_ig.noise import NoisyLinear, noise_disabled
    from lightning_ig.quadrature import quadrature
    from lightning_ig.report import SCHEMA_VERSION, build_report, completeness_summary, feature_statistics

"""The import paths that moved when the package was laid out in wings, kept working with a DeprecationWarning.

``import lightning_ig.noise`` (say) still works: a finder on ``sys.meta_path`` answers for every old path in
:data:`MOVED` with a stand-in module that warns once, at that import, and hands every attribute over from the
module that holds it now (``lightning_ig.models.noise``); a name that was renamed is found under its new name,
with a warning naming it. A module that stayed where it was but gave names away (:data:`LEFT`) answers for
them through :func:`forwarder`, its ``__getattr__``. docs/ARCHITECTURE.md ("Where names moved") lists the same
tables for readers. Every module here is named by a string and imported when a name is asked for, so this
module imports nothing of the package and sits below every wing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["LEFT", "MOVED", "forwarder", "install"]

MOVED: dict[str, tuple[str, dict[str, str]]] = {
    # old path: (the module that holds its names now, {old name: "module:new name"} for those that moved apart)
    "lightning_ig._cuda": (
        "lightning_ig.ops._cupy",
        {
            "resolve_backend": "lightning_ig.ops._cupy:choose_backend",
            "dtype_suffix": "lightning_ig.ops.dtypes:dtype_suffix",
        },
    ),
    "lightning_ig._soft_margin_cuda": ("lightning_ig.ops.soft_margin", {}),
    "lightning_ig.attribution.backends": (
        "lightning_ig.ops.ig",
        {
            "Backend": "lightning_ig.ops.ig:IGOps",
            "TorchBackend": "lightning_ig.ops.ig:TorchIG",
            "CudaBackend": "lightning_ig.ops.ig:CudaIG",
            "resolve_backend": "lightning_ig.ops.ig:ig_ops",
            "backend_option": "lightning_ig.ops.ig:check_backend",
            "accumulate_dtype": "lightning_ig.ops.dtypes:accumulate_dtype",
        },
    ),
    "lightning_ig.ensemble.ops": ("lightning_ig.ops.ensemble_reduce", {}),
    "lightning_ig.quadrature": ("lightning_ig.attribution.quadrature", {}),
    "lightning_ig.groups": (
        "lightning_ig.attribution.groups",
        {
            "automatic_groups": "lightning_ig.callback.setup:automatic_groups",
            "choose_groups": "lightning_ig.callback.setup:choose_groups",
        },
    ),
    "lightning_ig.host_result": ("lightning_ig.attribution.host_result", {}),
    "lightning_ig.statistics": (
        "lightning_ig.attribution.statistics",
        {
            "feature_statistics": "lightning_ig.views.report_rows:feature_statistics",
            "completeness_summary": "lightning_ig.views.report_rows:completeness_summary",
            "top_features": "lightning_ig.views.report_rows:top_features",
            "statistics_rows": "lightning_ig.views.report_rows:statistics_rows",
        },
    ),
    "lightning_ig.drift": ("lightning_ig.attribution.statistics", {}),
    "lightning_ig.noise": ("lightning_ig.models.noise", {}),
    "lightning_ig.names": ("lightning_ig.vocabulary", {}),
    "lightning_ig.heldout": (
        "lightning_ig.callback.heldout",
        {
            "load_states": "lightning_ig.callback.heldout:resolve_states",
            "TargetSpec": "lightning_ig.callback.heldout:TargetOption",
            "engine_warnings_once": "lightning_ig.attribution.result:stochastic_warnings_silenced",
            "TargetForward": "lightning_ig.callback.heldout:BoundForward",
        },
    ),
    "lightning_ig.summary": (
        "lightning_ig.views.summary",
        {"EnsembleSummary": "lightning_ig.ensemble.agreement:EnsembleSummary"},
    ),
    "lightning_ig.run_text": ("lightning_ig.views.text", {}),
    "lightning_ig.report": (
        "lightning_ig.views.report",
        {
            "ReportFolder": "lightning_ig.callback.reports:ReportFolder",
            "spearman": "lightning_ig.attribution.statistics:spearman",
            "topk_jaccard": "lightning_ig.attribution.statistics:topk_jaccard",
            "rank_order": "lightning_ig.attribution.statistics:rank_order",
            "default_feature_names": "lightning_ig.vocabulary:default_feature_names",
        },
    ),
    "lightning_ig.tensorboard": (
        "lightning_ig.views.tensorboard",
        {
            "custom_scalars_layout": "lightning_ig.views.layout:custom_scalars_layout",
            "ranked_labels": "lightning_ig.views.layout:ranked_labels",
            "target_unit": "lightning_ig.views.text:target_unit",
            "saliency_grid_image": "lightning_ig.views.pictures:saliency_grid_picture",
            "mean_abs_picture": "lightning_ig.views.pictures:mean_abs_map_picture",
        },
    ),
    "lightning_ig.figures": (
        "lightning_ig.views.charts",
        {
            "top_features_figure": "lightning_ig.views.charts:top_features_chart",
            "heatmap_figure": "lightning_ig.views.charts:heatmap_chart",
        },
    ),
    "lightning_ig.saliency": (
        "lightning_ig.views.saliency",
        {
            "mean_abs_image": "lightning_ig.views.saliency:mean_abs_map",
            "SaliencyImage": "lightning_ig.views.saliency:SaliencyPicture",
        },
    ),
    "lightning_ig.raster": ("lightning_ig.views.raster", {}),
    "lightning_ig.picture_writer": ("lightning_ig.views.tensorboard", {}),
    "lightning_ig.views.number_format": ("lightning_ig.views.text", {}),
}


LEFT: dict[str, dict[str, str]] = {
    # a module that stayed: {name it gave away: "module:name" where it lives now}
    "lightning_ig.vocabulary": {
        name: f"lightning_ig.attribution.checks:{name}"
        for name in ("check_states", "check_finite", "check_device", "check_float_dtype", "check_generator")
    }
    | {"target_label": "lightning_ig.attribution.targets:target_label"},
    "lightning_ig.attribution": {"check_finite": "lightning_ig.attribution.checks:check_finite"},
    "lightning_ig.attribution.graphs": {
        "GraphPlan": "lightning_ig.attribution.engine:GraphPlan",
        "PlanCache": "lightning_ig.attribution.engine:PlanCache",
    },
    "lightning_ig.attribution.host_result": {"JointGather": "lightning_ig.attribution.gather:JointGather"},
    "lightning_ig.callback.setup": {
        name: f"lightning_ig.callback.options:{name}"
        for name in ("check_cadence", "check_cadences", "check_name", "check_saliency_channel_index")
    },
    "lightning_ig.views.report": {
        name: f"lightning_ig.views.report_rows:{name}"
        for name in ("completeness_summary", "feature_statistics", "statistics_rows", "top_features")
    },
    "lightning_ig.views.summary": {
        name: f"lightning_ig.views.text:{name}"
        for name in (
            "DRIFT_WORDS",
            "completeness_sentence",
            "completeness_verdict",
            "per_state_pointer",
            "report_markdown",
            "target_unit",
        )
    },
}


def _warn_and_find(old: str, where: str) -> Any:
    module, _, new_name = where.partition(":")
    warnings.warn(f"{old} is {module}.{new_name} now; import it from there", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(module), new_name)


def forwarder(module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of a module in :data:`LEFT`: a name it gave away warns and is found where it lives."""
    gone = LEFT[module]

    def __getattr__(name: str) -> Any:
        if name not in gone:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return _warn_and_find(f"{module}.{name}", gone[name])

    return __getattr__


class _MovedModule(types.ModuleType):
    """The stand-in at an old path: every attribute comes from where it lives now."""

    _target: str
    _renamed: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        where = self._renamed.get(name)
        if where is None:
            value = getattr(importlib.import_module(self._target), name)
        else:
            value = _warn_and_find(f"{self.__name__}.{name}", where)
        setattr(self, name, value)  # found once: the warning is said once per name
        return value

    def __dir__(self) -> list[str]:
        return sorted({*dir(importlib.import_module(self._target)), *self._renamed})


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _MovedModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        target, renamed = MOVED[module.__name__]
        module._target = target  # type: ignore[attr-defined]
        module._renamed = renamed  # type: ignore[attr-defined]
        real = importlib.import_module(target)
        module.__doc__ = f"Moved to :mod:`{target}` (this path warns and forwards)."
        module.__all__ = [*getattr(real, "__all__", []), *renamed]  # type: ignore[attr-defined]
        warnings.warn(
            f"{module.__name__} moved to {target}; import from there (the old path will go in a later release)",
            DeprecationWarning,
            stacklevel=2,  # the importer's frame: the import machinery's own frames are skipped
        )


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), origin=MOVED[fullname][0])


_FINDER = _Finder()


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once): the package's ``__init__`` does, so an old path always works."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_FINDER)

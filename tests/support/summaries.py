"""A hand-built run summary: what the views read, with the figures a test picks."""

from __future__ import annotations

import numpy as np

from lightning_ig.attribution.targets import Target
from lightning_ig.run.host_result import Moments
from lightning_ig.run.statistics import Completeness
from lightning_ig.run.summary import RunSettings, RunSummary, Units

__all__ = ["make_summary"]


def make_summary(
    worst: float = 0.004,
    non_finite: int = 0,
    degenerate: int = 0,
    groups: bool = False,
    estimate: float = 0.004,
    mass_relative: float = 0.001,
    near: int = 0,
) -> RunSummary:
    moments = Moments.of(np.array([[1.0, -20.0, 3.0], [2.0, -30.0, 5.0]]))
    names = ["cart position", "pole/angle", "x2"]
    units = Units("groups" if groups else "features", names, moments, None, np.array([2, 2, 2]) if groups else None)
    return RunSummary(
        step=300,
        run_index=2,
        settings=RunSettings(Target.parse("mean"), "zeros", 0.01, 10),
        num_states=2,
        feature_shape=(3,),
        n_steps=50,
        method="gausslegendre",
        gradient="autograd",
        backend="torch",
        features=moments,
        logged_features=None if groups else units,
        groups=units if groups else None,
        completeness=Completeness(
            worst,
            1e-4,
            2,
            degenerate,
            non_finite,
            0 if non_finite else None,
            0.01,
            worst_attribution_error=estimate,
            worst_mass_relative_error=mass_relative,
            num_near_baseline=near,
        ),
        drift={"spearman_prev": 0.5},
        concentration={"top1pct_share": 0.8, "top10pct_share": 0.8},
    )

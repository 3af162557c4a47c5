"""The callback's calibration (lightning_ig/callback/calibration.py): due at the first run and every
``calibrate_every`` runs, the engine's rule and scale replaced, its cost in the run's summary."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions
from lightning_ig.attribution import engine as engine_module
from lightning_ig.attribution.calibration import CANDIDATES
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback import calibration as callback_calibration
from lightning_ig.callback import callback as callback_module
from tests.support.tiny import TinyQNet, dataset, held_out_states, make_trainer


def _fit(tmp_path: Path, callback: IntegratedGradientsCallback, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Fit 10 steps (a run every 2) and return each run's summary, as the callback made it."""
    summaries: list[Any] = []
    summarize = callback_module.summarize

    def recorded(*args: Any, **kwargs: Any) -> Any:
        summaries.append(None)  # a placeholder: noted() may replace the summary after this
        return summarize(*args, **kwargs)

    noted = callback_calibration.noted

    def noted_recorded(summary: Any, calibration_ms: float) -> Any:
        summaries[-1] = noted(summary, calibration_ms)
        return summaries[-1]

    monkeypatch.setattr(callback_module, "summarize", recorded)
    monkeypatch.setattr(callback_calibration, "noted", noted_recorded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = make_trainer(tmp_path, [callback], max_steps=10, logger=False)
        trainer.fit(TinyQNet(noisy=False, dropout=0.0, batchnorm=False), DataLoader(dataset(64), batch_size=8))
    return summaries


def test_calibration_runs_at_the_first_run_and_every_k_runs_with_its_cost(tmp_path, monkeypatch):
    # the scale calibration measured, made 2.5 here (the tiny net's estimate is centred: its own scale would be 1)
    seen: list[dict[str, Any]] = []
    measured = engine_module.calibrate

    def recentred(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return dataclasses.replace(measured(*args, **kwargs), error_scale=2.5)

    monkeypatch.setattr(engine_module, "calibrate", recentred)
    callback = IntegratedGradientsCallback(
        held_out_states(16), every_n_steps=2, calibrate_every=2, engine=IGOptions(n_steps=8)
    )
    summaries = _fit(tmp_path, callback, monkeypatch)
    assert [kwargs["batch"] for kwargs in seen] == [16, 16, 16]  # "budget" as the runs on all 16 states see it
    assert len(callback.history) == 5  # steps 2, 4, 6, 8, 10
    calibrated = [summary is not None for summary in summaries]
    assert calibrated == [True, False, True, False, True]  # runs 0, 2, 4
    for summary in summaries:
        if summary is not None:
            assert summary.completeness.calibration_ms > 0
    settings = callback._fit.engine.options
    assert settings.method in CANDIDATES
    assert settings.error_scale == 2.5  # what calibration measured, carried into every run's figures
    assert summaries[-1].completeness.error_scale == settings.error_scale


def test_no_calibration_when_it_is_off(tmp_path, monkeypatch):
    callback = IntegratedGradientsCallback(
        held_out_states(16), every_n_steps=2, calibrate_every=None, engine=IGOptions(n_steps=8)
    )
    summaries = _fit(tmp_path, callback, monkeypatch)
    assert len(summaries) == 5 and all(summary is None for summary in summaries)
    settings = callback._fit.engine.options
    assert settings.method == "riemann_middle" and settings.error_scale == 1.0


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (2.5, TypeError), ("50", TypeError), (True, TypeError)])
def test_calibrate_every_is_checked(value: Any, error: type) -> None:
    with pytest.raises(error, match="calibrate_every"):
        IntegratedGradientsCallback(torch.zeros(2, 4), calibrate_every=value)

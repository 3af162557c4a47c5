"""lightning_ig.callback.options: every option checked once, kept as checked, and read as the callback's attribute."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback.options import Options, check_options
from tests.support.tiny import held_out_states


def _defaults(**given: object) -> dict[str, object]:
    parameters = inspect.signature(IntegratedGradientsCallback).parameters
    values = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}
    return {"states": held_out_states(), **values, **given}


def test_every_argument_of_the_callback_is_an_option_and_nothing_else() -> None:
    fields = {field.name for field in dataclasses.fields(Options)}
    assert fields == set(inspect.signature(IntegratedGradientsCallback).parameters)


def test_options_are_kept_as_checked() -> None:
    options = check_options(_defaults(feature_names=("a", "b", "c", "d"), report_dir="reports", every_n_epochs=2))
    assert options.feature_names == ["a", "b", "c", "d"]  # a list, whatever sequence came in
    assert options.report_dir == Path("reports") and options.every_n_epochs == 2
    with pytest.raises(MisconfigurationException, match="needs a cadence"):
        check_options(_defaults(every_n_steps=None, every_n_epochs=None))


def test_the_callback_reads_its_options_as_attributes() -> None:
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=7, name="value")
    assert callback.options.every_n_steps == callback.every_n_steps == 7 and callback.name == "value"
    with pytest.raises(AttributeError, match="no attribute 'not_an_option'"):
        callback.not_an_option  # noqa: B018
    assert not hasattr(IntegratedGradientsCallback.__new__(IntegratedGradientsCallback), "top_k")  # not made yet

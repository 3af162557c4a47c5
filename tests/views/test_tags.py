"""views/tags.py: how much a callback logs (ViewOptions, a row per option of what it refuses), the tags it logs
and the labels in them."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest

from lightning_ig.views import ViewOptions
from lightning_ig.views.tags import display_labels

BAD: list[tuple[str, Any, type[Exception], str]] = [
    ("top_k", 0, ValueError, "int >= 1"),
    ("top_k", 2.5, TypeError, "got float"),
    ("log_histograms", "False", TypeError, r"True or False, got str \('False'\)"),
    ("log_histograms", None, TypeError, "True or False"),
    ("figure_every_n_runs", "auto", TypeError, "int >= 1"),
    ("figure_every_n_runs", 0, ValueError, "int >= 1"),
    ("max_logged_features", 0, ValueError, "int >= 1"),
    ("max_logged_features", None, TypeError, "got NoneType"),
    ("saliency_states", 0, ValueError, "int >= 1"),
    ("saliency_states", True, TypeError, "got bool"),
    ("saliency_channel", -1, ValueError, ">= 0"),
    ("saliency_channel", 1.0, TypeError, "got float"),
    ("saliency_every_n_runs", 0, ValueError, "int >= 1"),
    ("saliency_every_n_runs", None, TypeError, "got NoneType"),
]


def test_every_view_option_has_rows() -> None:
    assert {name for name, *_ in BAD} == {field.name for field in dataclasses.fields(ViewOptions)}


@pytest.mark.parametrize(("name", "value", "error", "words"), BAD, ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD)])
def test_a_bad_view_option_is_refused_naming_it(name: str, value: Any, error: type, words: str) -> None:
    for make in (lambda: ViewOptions(**{name: value}), lambda: dataclasses.replace(ViewOptions(), **{name: value})):
        with pytest.raises(error) as caught:
            make()
        message = str(caught.value)
        assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message) and re.search(words, message), message


def test_view_options_take_numpy_integers_and_are_read_only() -> None:
    views = ViewOptions(top_k=np.int64(5), saliency_channel=np.int32(0), figure_every_n_runs=None)
    assert (views.top_k, views.saliency_channel, views.figure_every_n_runs) == (5, 0, None)
    assert type(views.top_k) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        views.top_k = 3  # type: ignore[misc]


def test_labels_are_readable_and_generated_ones_sort_numerically():
    assert display_labels(["cart position", "pole/angle"]) == ["cart position", "pole∕angle"]
    labels = display_labels(["x[0,3,9]", "x[0,10,2]", "x[1,0,0]"], generated=True)
    assert labels == ["x[00,03,09]", "x[00,10,02]", "x[01,00,00]"] and sorted(labels) == labels
    assert display_labels(["channel 0", "channel 10", "channel 2"], generated=True) == [
        "channel 00",
        "channel 10",
        "channel 02",
    ]

"""attribution/settings.py: IGOptions, the engine's options, each refusing wrong kinds and bad values by name (one
table, a row per option), kept as checked and read-only."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import pytest

from lightning_ig.attribution import IGOptions, IntegratedGradients, integrated_gradients
from lightning_ig.attribution.settings import options_with

# Every option with values it refuses: the wrong kind (a string for a number, a bool for a count, a number for a
# flag) and out of range; the words its message holds beside the option's name.
BAD: list[tuple[str, Any, type[Exception], str]] = [
    ("n_steps", 0, ValueError, "int >= 1"),
    ("n_steps", "many", ValueError, "'budget' or 'auto'"),
    ("n_steps", 2.5, TypeError, "got float"),
    ("n_steps", True, TypeError, "got bool"),
    ("method", "simpson", ValueError, "must be one of"),
    ("method", "warped_middle:2", ValueError, "must be one of"),
    ("method", 3, TypeError, "got int"),
    ("gradient", "numerical", ValueError, "'autograd', 'finite_difference'"),
    ("gradient", None, TypeError, "got NoneType"),
    ("backend", "gpu", ValueError, "'auto', 'cuda', 'torch'"),
    ("backend", 1, TypeError, ""),
    ("internal_batch_size", 0, ValueError, "int >= 1"),
    ("internal_batch_size", "8", TypeError, "got str"),
    ("completeness_tol", 0, ValueError, "> 0"),
    ("completeness_tol", math.nan, ValueError, "finite"),
    ("completeness_tol", "0.01", TypeError, "a number"),
    ("max_steps", 0, ValueError, "int >= 1"),
    ("max_steps", True, TypeError, "got bool"),
    ("fd_step", 1.0, ValueError, "< 1"),
    ("fd_step", math.inf, ValueError, "finite"),
    ("fd_step", "small", TypeError, "a number"),
    ("check_finite", 1, TypeError, "True or False"),
    ("check_finite", "no", TypeError, "True or False"),
    ("cuda_graph", "always", ValueError, "True, False or 'auto'"),
    ("cuda_graph", 1, TypeError, "True, False or 'auto'"),
]


def test_every_option_has_rows() -> None:
    assert {name for name, *_ in BAD} == {field.name for field in dataclasses.fields(IGOptions)}


@pytest.mark.parametrize(("name", "value", "error", "words"), BAD, ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD)])
def test_a_bad_option_is_refused_where_it_comes_in_naming_it(name: str, value: Any, error: type, words: str) -> None:
    for make in (lambda: IGOptions(**{name: value}), lambda: dataclasses.replace(IGOptions(), **{name: value})):
        with pytest.raises(error) as caught:
            make()
        message = str(caught.value)
        assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message) and re.search(words, message), message


def test_options_are_kept_in_one_spelling_and_read_only() -> None:
    options = IGOptions(n_steps=np.int64(32), internal_batch_size=np.int32(64), method="kink_midpoint")
    assert (options.n_steps, options.internal_batch_size, options.method) == (32, 64, "kink_midpoint")
    assert type(options.n_steps) is int and type(options.internal_batch_size) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.n_steps = 64  # type: ignore[misc]
    with pytest.raises(ValueError, match="n_steps='auto' refines by tripling the midpoint nodes"):
        IGOptions(n_steps="auto", method="gausslegendre")


def test_the_engine_takes_its_options_as_keywords_and_names_an_unknown_one() -> None:
    engine = IntegratedGradients(lambda x: x.sum(1), target=None, n_steps=8, method="riemann_left")
    assert engine.options == IGOptions(n_steps=8, method="riemann_left") and engine.target.kind == "output"
    assert IntegratedGradients(lambda x: x.sum(1), **engine.options.keywords()).options == engine.options
    with pytest.raises(TypeError, match="unknown option"):
        options_with(IGOptions(), {"steps": 8})
    with pytest.raises(TypeError, match=r"unknown option\(s\) steps; the engine takes target, n_steps"):
        engine.attribute(np.zeros(1), steps=8)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'steps'"):
        integrated_gradients(lambda x: x.sum(1), np.zeros(1), steps=8)

"""lightning_ig.callback.options: every argument of the callback checked once (a table of wrong kinds and bad values,
one row per argument), kept as checked, read as an attribute and never assigned."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_ig.attribution import IGOptions
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback.options import Options
from lightning_ig.views import ViewOptions
from tests.support import REPO
from tests.support.tiny import TinyQNet, held_out_states

Bad = tuple[str, Any, type[Exception], str]  # argument, value, error, words the message holds beside the name

# Every argument of the callback with values it refuses: of the wrong kind (never read as another: bool("no") is
# True, list("abc") is three names) and out of range. The grouped knobs' own rows are their classes' tests
# (tests/attribution/test_settings.py, tests/views/test_tags.py); here, that the groups take only their class.
BAD: list[Bad] = [
    ("states", 3, TypeError, r"a tensor \(num_states, .*; got int$"),
    ("states", [[0.0, 1.0, 2.0]], TypeError, r"got list$"),  # was told "for a model of several inputs, concatenate"
    ("states", {"a": torch.zeros(2, 3)}, TypeError, "got dict; for a model of several inputs, concatenate them"),
    (
        "states",
        (torch.zeros(2, 3),),
        TypeError,
        r"got tuple; .* split it again inside forward=callable\(pl_module, x\)",
    ),
    ("states", torch.zeros(3, 2, dtype=torch.int64), TypeError, "floating"),
    ("states", torch.tensor([[0.0, math.nan]]), ValueError, "NaN"),
    ("every_n_steps", 0, MisconfigurationException, "int >= 1"),
    ("every_n_steps", "100", TypeError, "got str"),
    ("every_n_steps", 2.5, TypeError, "got float"),
    ("every_n_steps", True, TypeError, "got bool"),
    ("every_n_epochs", 0, MisconfigurationException, "int >= 1"),
    ("every_n_epochs", "1", TypeError, "got str"),
    ("run_at_train_end", "no", TypeError, r"True or False, got str \('no'\)"),
    ("run_at_train_end", 1, TypeError, "True or False"),
    ("feature_names", "abcd", TypeError, "a list of strings"),
    ("feature_names", ["a", "a"], ValueError, "repeats"),
    ("feature_names", [1, 2], TypeError, ""),
    ("feature_groups", "pixels", ValueError, "'features', 'channels'"),
    ("feature_groups", 3, TypeError, "None"),
    # an integer mask as a list (a config file's): refused as not "an integer mask", which it is; say which kinds
    ("feature_groups", [0, 0, 1, 1], TypeError, r"integer mask of the feature shape \(a tensor or array"),
    ("group_names", "abc", TypeError, r"a list of strings, got str \('abc'\)"),
    ("action_names", "left", TypeError, "a list of strings"),
    ("action_names", ["left", "right"], ValueError, "no action is attributed"),  # target="mean"
    ("baseline", "ones", ValueError, "'zeros', 'mean', a finite number"),
    ("baseline", math.nan, ValueError, "finite"),
    ("baseline", math.inf, ValueError, "finite"),
    ("baseline", True, TypeError, "got bool"),
    ("baseline", [0.5], TypeError, "got list"),
    ("baseline", torch.ones(4, dtype=torch.int64), TypeError, "floating-point tensor"),
    ("target", "median", ValueError, r"^target must be 'mean', 'each', 'contrast', .*, got 'median'$"),  # once
    ("target", -1, ValueError, "non-negative action index"),
    ("target", True, TypeError, "bool"),
    ("target", 2.5, TypeError, "got float"),
    ("target", "action:\u0663", ValueError, r"or 'action:N' in digits 0-9\) .*, got 'action:\u0663'$"),  # Arabic 3
    ("target", None, TypeError, "forward="),
    ("target", torch.tensor([0, 1]), TypeError, "an output index"),
    ("forward", 3, TypeError, "callable"),
    ("completeness_tol", 0, ValueError, "> 0"),
    ("completeness_tol", math.nan, ValueError, "finite"),
    ("completeness_tol", "0.01", TypeError, "a number"),
    ("completeness_tol", "1e-3", TypeError, r"a number written as text .*write 1\.0e-3"),  # YAML 1.1 reads it so
    ("on_non_finite", "ignore", ValueError, "'warn', 'raise'"),
    ("on_non_finite", 1, TypeError, ""),
    ("report_dir", 3, TypeError, r"a path \(str or os.PathLike\), got int"),
    ("report_dir", "", ValueError, "non-empty"),
    ("name", "a/b", ValueError, "without '/'"),
    ("name", "  ", ValueError, "not blank"),  # the message says what is wrong: it said only "without '/'"
    ("name", "value\n", ValueError, "printable"),
    ("name", 3, TypeError, "a short label"),
    ("engine", {"n_steps": 8}, TypeError, r"None or IGOptions\(\.\.\.\) \(a dict's fields: IGOptions\(\*\*fields\)\)"),
    ("engine", IGOptions(completeness_tol=0.05), ValueError, "pass completeness_tol=0.05 to the callback"),
    ("views", {"top_k": 5}, TypeError, "ViewOptions"),
    ("views", 3, TypeError, r"must be None or ViewOptions\(\.\.\.\), got int"),
    ("overhead", 0, ValueError, r"in \(0, 1\].*pass None for no budget"),
    ("overhead", 1.5, ValueError, "got 1.5"),
    ("overhead", float("nan"), ValueError, "fraction of the fit's wall time"),
    ("overhead", "2%", TypeError, "e.g. 0.02 for 2%"),
    ("overhead", True, TypeError, "got bool"),
]

PARAMETERS = inspect.signature(IntegratedGradientsCallback).parameters


def test_every_argument_has_rows_and_is_a_field_of_the_options() -> None:
    assert {name for name, *_ in BAD} == set(PARAMETERS) == {field.name for field in dataclasses.fields(Options)}
    assert len(PARAMETERS) <= 18


@pytest.mark.parametrize(("name", "value", "error", "words"), BAD, ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD)])
def test_a_bad_argument_is_refused_when_the_callback_is_made_naming_it(
    name: str, value: Any, error: type[Exception], words: str
) -> None:
    given = {"states": held_out_states(), name: value}
    with pytest.raises(error) as caught:
        IntegratedGradientsCallback(**given)
    message = str(caught.value)
    assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message), message
    assert re.search(words, message), message


def test_forward_keeps_the_target_at_mean_and_a_cadence_is_needed() -> None:
    with pytest.raises(ValueError, match="target must stay 'mean'"):
        IntegratedGradientsCallback(held_out_states(), target=1, forward=lambda module, x: module(x)[:, 0])
    with pytest.raises(MisconfigurationException, match="needs a cadence"):
        IntegratedGradientsCallback(held_out_states(), every_n_steps=None)


def test_options_are_kept_as_checked_numpy_integers_and_a_number_baseline_included() -> None:
    callback = IntegratedGradientsCallback(
        held_out_states(),
        every_n_steps=np.int64(2),
        every_n_epochs=np.int32(3),
        feature_names=("a", "b", "c", "d"),
        baseline=np.float32(0.5),
        target=np.int64(1),
        overhead=np.float32(0.25),
        report_dir="reports",
        completeness_tol=0.02,
    )
    options = callback.options
    assert (options.every_n_steps, options.every_n_epochs, options.overhead) == (2, 3, 0.25)
    assert all(type(value) is int for value in (options.every_n_steps, options.every_n_epochs))
    assert type(options.overhead) is float
    assert options.baseline == 0.5 and type(options.baseline) is float
    assert options.target.label == "action:1" and options.identity()["target"] == 1
    assert options.feature_names == ["a", "b", "c", "d"] and options.report_dir == Path("reports")
    assert options.engine == IGOptions(completeness_tol=0.02)  # one tolerance: the callback's, in the engine's too
    assert options.views == ViewOptions()


def test_the_callback_reads_its_options_as_attributes() -> None:
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=7, name="value")
    assert callback.options.every_n_steps == callback.every_n_steps == 7 and callback.name == "value"
    assert callback.engine == IGOptions() and callback.views.top_k == 10
    with pytest.raises(AttributeError, match="no attribute 'not_an_option'"):
        callback.not_an_option  # noqa: B018
    assert not hasattr(IntegratedGradientsCallback.__new__(IntegratedGradientsCallback), "views")  # not made yet


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("every_n_steps", 1, r"every_n_steps is fixed when the callback is made .*IntegratedGradientsCallback\(\.\.\."),
        ("target", "each", "target is fixed when the callback is made"),
        ("options", None, "options is fixed when the callback is made"),
        ("n_steps", 64, r"an option of the callback's engine= \(IGOptions\).*dataclasses.replace\(callback.engine"),
        ("top_k", 3, r"an option of the callback's views= \(ViewOptions\).*dataclasses.replace\(callback.views"),
    ],
)
def test_an_option_assigned_after_the_callback_is_made_raises_and_nothing_changes(
    name: str, value: Any, words: str
) -> None:
    callback = IntegratedGradientsCallback(held_out_states())
    options = callback.options
    with pytest.raises(AttributeError, match=words):
        setattr(callback, name, value)
    assert callback.options is options and callback.every_n_steps == 100 and "n_steps" not in vars(callback)
    callback.history = [{"global_step": 1}]  # what is not an option is assigned as usual
    assert callback.history == [{"global_step": 1}]


def test_the_grouped_options_are_changed_by_replace_into_a_new_callback() -> None:
    first = IntegratedGradientsCallback(held_out_states(), engine=IGOptions(n_steps=32))
    second = IntegratedGradientsCallback(held_out_states(), engine=dataclasses.replace(first.engine, n_steps=64))
    assert (first.engine.n_steps, second.engine.n_steps) == (32, 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.engine.n_steps = 64  # type: ignore[misc]


def test_every_argument_has_a_type_a_config_file_parser_reads() -> None:
    """LightningCLI (jsonargparse) builds the callback, and its ``engine=`` and ``views=`` from nested mappings, from
    the types of the signature: each argument annotated, every annotation resolvable at run time (not only for a type
    checker), none a bare ``Any`` that would let any value through unchecked."""
    for made in (IntegratedGradientsCallback.__init__, IGOptions, ViewOptions):
        hints = typing.get_type_hints(made)
        parameters = [name for name in inspect.signature(made).parameters if name != "self"]
        assert parameters and all(name in hints and hints[name] is not Any for name in parameters), made


class _ListConfig(Sequence[Any]):  # a config library's list (OmegaConf's ListConfig): a Sequence, not a list
    def __init__(self, *items: Any) -> None:
        self._items = list(items)

    def __getitem__(self, index: Any) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)


class _DictConfig(Mapping[str, Any]):  # and its dict (DictConfig): a Mapping, not a dict
    def __init__(self, **items: Any) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_a_config_file_s_plain_values_make_the_callback_python_code_makes(tmp_path: Path) -> None:
    """Every argument a config file can give, as a YAML loader reads it (strings, ints, floats, lists, dicts, null;
    the engine's and views' options as dicts) or as a config library hands it on (its own list and dict types), makes
    the callback the same Python code makes (README, "From a config file")."""
    np.save(tmp_path / "states.npy", held_out_states().numpy())
    config = {
        "states": str(tmp_path / "states.npy"),
        "every_n_steps": 500,
        "every_n_epochs": None,
        "run_at_train_end": False,
        "feature_names": ["cart x", "cart v", "pole angle", "pole v"],
        "feature_groups": {"cart": [0, 1], "pole": [2, 3]},
        "group_names": ["the cart", "the pole"],
        "action_names": ["left", "right"],
        "baseline": 0,
        "target": "action:1",
        "completeness_tol": 0.02,
        "on_non_finite": "raise",
        "report_dir": "reports",
        "name": "value",
        "engine": {"n_steps": "auto", "max_steps": 168},
        "views": {"top_k": 3, "saliency_states": None},
        "overhead": None,
    }
    code = IntegratedGradientsCallback(
        tmp_path / "states.npy",
        every_n_steps=500,
        every_n_epochs=None,
        run_at_train_end=False,
        feature_names=("cart x", "cart v", "pole angle", "pole v"),
        feature_groups={"cart": torch.tensor([0, 1]), "pole": torch.tensor([2, 3])},
        group_names=("the cart", "the pole"),
        action_names=("left", "right"),
        baseline=0.0,
        target=1,
        completeness_tol=0.02,
        on_non_finite="raise",
        report_dir=Path("reports"),
        name="value",
        engine=IGOptions(n_steps="auto", max_steps=168),
        views=ViewOptions(top_k=3, saliency_states=None),
        overhead=None,
    ).options
    library = {
        name: _ListConfig(*value)
        if isinstance(value, list)
        else _DictConfig(**value)
        if name == "feature_groups"
        else value
        for name, value in config.items()
    }
    library["feature_groups"] = _DictConfig(cart=_ListConfig(0, 1), pole=_ListConfig(2, 3))
    for given in (config, library):
        grouped = {"engine": IGOptions(**given["engine"]), "views": ViewOptions(**given["views"])}
        options = IntegratedGradientsCallback(**{**given, **grouped}).options
        for field in dataclasses.fields(Options):
            if field.name not in ("target", "feature_groups"):
                assert getattr(options, field.name) == getattr(code, field.name), field.name
        assert options.target.label == code.target.label and options.identity() == code.identity()
        made = FeatureGroups.resolve(options.feature_groups, (4,), options.group_names)
        assert torch.equal(made.ids, FeatureGroups.resolve(code.feature_groups, (4,), code.group_names).ids)
        assert made.names == ["the cart", "the pole"]


def test_the_readme_s_lightning_cli_config_makes_the_callback_python_code_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's ``LightningCLI`` config, parsed by LightningCLI itself (its jsonargparse: not a dependency, so
    skipped without it), makes the callback its Python code makes."""
    pytest.importorskip("jsonargparse")
    yaml = pytest.importorskip("yaml")
    from lightning.pytorch.cli import LightningCLI  # its parser needs jsonargparse

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("**From a config file.**") :].split("```yaml\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    np.save("held_out_states.npy", held_out_states().numpy())
    config = {"trainer": {"logger": False, "enable_checkpointing": False, **yaml.safe_load(block)["trainer"]}}
    cli = LightningCLI(TinyQNet, run=False, args=config, save_config_callback=None)
    made = next(c for c in cli.trainer.callbacks if isinstance(c, IntegratedGradientsCallback)).options
    code = IntegratedGradientsCallback(
        "held_out_states.npy",
        every_n_steps=500,
        feature_names=["cart position", "cart velocity", "pole angle", "pole angular velocity"],
        feature_groups={"cart": [0, 1], "pole": [2, 3]},
        target=1,
        engine=IGOptions(n_steps="auto"),
        views=ViewOptions(top_k=5),
    ).options
    for field in dataclasses.fields(Options):
        if field.name != "target":
            assert getattr(made, field.name) == getattr(code, field.name), field.name
    assert made.target.label == code.target.label == "action:1" and made.identity() == code.identity()

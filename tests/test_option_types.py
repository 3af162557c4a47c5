"""Every public option refuses a value of the wrong kind with an error that names it; generated from the signatures.

For each public callable (every function and class of ``lightning_ig.__all__`` and of the names its wings export in
the top level's place, and the public methods of those classes that take options), each parameter's annotation (and
its default) says which kinds of value it accepts. A value of every other kind in :data:`CANDIDATES` (a string for a
flag, a bool for a count, NaN for a number, a bare string for a list of names, ``object()`` for anything, ...) is
passed to it, alone, on an otherwise valid call, and must raise ``TypeError`` or ``ValueError`` whose message names
the parameter. A new option is checked by this file the day it is added; a new public callable fails
:func:`test_every_public_callable_is_covered` until it has a row in :func:`entry_points`. The command line: every
flag with a type or choices gets wrong values through ``main([...])`` and must exit 2 with a line naming the flag.
"""

from __future__ import annotations

import argparse
import collections.abc
import functools
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ForwardRef, Literal, Union, get_args, get_origin

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import lightning_ig
from lightning_ig.attribution.quadrature import quadrature
from lightning_ig.checkpoint import list_heads, load_states, save_merged_checkpoint
from lightning_ig.cli import main
from lightning_ig.cli.parser import build_parser
from lightning_ig.models import build_model
from lightning_ig.views.report import build_report
from lightning_ig.views.report_rows import completeness_summary

# ------------------------------------------------------------------------------------------------ kinds


def kinds_of(annotation: Any, namespace: dict[str, Any]) -> frozenset[str]:
    """The kinds a parameter accepts, from its (evaluated) annotation; ``{"any"}`` when it accepts anything."""
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, namespace)  # noqa: S307 - the package's own annotations
        except Exception:  # noqa: BLE001 - a name only imported for type checkers
            return frozenset({"any"})  # a name imported for type checkers only (a protocol): nothing to feed it
    if isinstance(annotation, ForwardRef):
        return kinds_of(annotation.__forward_arg__, namespace)
    if annotation is Any or annotation is inspect.Parameter.empty or isinstance(annotation, typing.TypeVar):
        return frozenset({"any"})
    if annotation is None or annotation is type(None):
        return frozenset({"none"})
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        return frozenset().union(*(kinds_of(arg, namespace) for arg in args))
    if origin is Literal:
        return frozenset(f"choice:{arg}" if isinstance(arg, str) else _scalar(type(arg)) for arg in args)
    if origin in (collections.abc.Sequence, list, tuple, collections.abc.Iterable):
        inner = kinds_of(args[0], namespace) if args else frozenset({"any"})
        return frozenset({"seq:" + "|".join(sorted(inner))})
    if origin in (collections.abc.Mapping, dict) or annotation in (dict, collections.abc.Mapping):
        return frozenset({"mapping"})
    if origin is collections.abc.Callable or annotation is collections.abc.Callable or origin is type:
        return frozenset({"callable"})
    if origin is os.PathLike or annotation is os.PathLike:
        return frozenset({"path"})
    if annotation in (bool, int, float, str):
        return frozenset({_scalar(annotation)})
    for kind, cls in (
        ("tensor", Tensor),
        ("module", nn.Module),
        ("generator", torch.Generator),
        ("dtype", torch.dtype),
        ("device", torch.device),
        ("array", np.ndarray),
    ):
        if annotation is cls or (isinstance(annotation, type) and issubclass(annotation, cls)):
            return frozenset({kind})
    if isinstance(annotation, type):
        return frozenset({f"instance:{annotation.__module__}.{annotation.__qualname__}"})
    return frozenset({"any"})  # pragma: no cover - an annotation form this file does not know: nothing to test


def _scalar(cls: type) -> str:
    return {bool: "bool", int: "int", float: "float", str: "text"}[cls]


def accepts(kind: str, value: Any) -> bool:
    """Whether a value of ``kind``'s kind is ``value`` (the right kind, whatever its range)."""
    if kind == "any":
        return True
    if kind == "none":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "text":
        return isinstance(value, str)
    if kind.startswith("choice:"):
        return isinstance(value, str) and value == kind[len("choice:") :]
    if kind.startswith("seq:"):
        inner = kind[len("seq:") :].split("|")
        return isinstance(value, (list, tuple)) and all(any(accepts(k, item) for k in inner) for item in value)
    if kind == "mapping":
        return isinstance(value, dict)
    if kind == "callable":
        return callable(value)
    if kind == "path":
        return isinstance(value, (str, os.PathLike))
    if kind == "device":
        return isinstance(value, (str, torch.device))
    simple = {
        "tensor": Tensor,
        "module": nn.Module,
        "generator": torch.Generator,
        "dtype": torch.dtype,
        "array": np.ndarray,
    }
    if kind in simple:
        return isinstance(value, simple[kind])
    assert kind.startswith("instance:"), kind
    return f"{type(value).__module__}.{type(value).__qualname__}" == kind[len("instance:") :]


CANDIDATES: list[tuple[str, Any]] = [
    ("the string 'no'", "no"),
    ("True", True),
    ("the int 3", 3),
    ("the float 2.5", 2.5),
    ("NaN", math.nan),
    ("infinity", math.inf),
    ("a list [1]", [1]),
    ("a list ['a', 1]", ["a", 1]),
    ("a dict", {"no": 1}),
    ("object()", object()),
]
"""Values of one kind each; a parameter gets every one its kinds do not accept."""


# ------------------------------------------------------------------------------------------------ entry points


@dataclass(frozen=True)
class Entry:
    """A public callable: where its signature comes from, and a valid call that options are added to."""

    name: str
    target: Callable[..., Any]
    required: Callable[[Path], dict[str, Any]]  # valid values of the required parameters (fresh per call)
    owner: Callable[[], Any] | None = None  # for a method: makes the object it is called on
    extra: tuple[inspect.Parameter, ...] = ()  # the options behind a **kwargs

    def call(self, folder: Path, options: dict[str, Any]) -> Any:
        function = self.target if self.owner is None else getattr(self.owner(), self.target.__name__)
        return function(**{**self.required(folder), **options})


def _none(folder: Path) -> dict[str, Any]:
    return {}


def _q(state_dim: int = 4) -> nn.Module:
    return lightning_ig.DuelingQNetwork(state_dim, 2, hidden_sizes=(8,), noisy=False).eval()


def _value(x: Tensor) -> Tensor:
    return _q()(x).mean(dim=1)


_STATES = torch.linspace(-1, 1, 12).reshape(3, 4)


def _result() -> Any:
    return lightning_ig.integrated_gradients(_q(), _STATES, target="mean", n_steps=4)


def _members_result() -> Any:
    ensemble = lightning_ig.Ensemble([_q(), _q()]).eval()
    return lightning_ig.integrated_gradients(ensemble.member_signals, _STATES, target="each", n_steps=4)


def _checkpoint(folder: Path) -> Path:
    path = folder / "q.safetensors"
    if not path.exists():
        lightning_ig.save_checkpoint(_q(), path, feature_names=["a", "b", "c", "d"], states=_STATES)
    return path


def _engine_options() -> tuple[inspect.Parameter, ...]:
    """The keyword options of integrated_gradients and ``cuda_graph``: what ``**defaults``/``**overrides`` take."""
    options = [
        p
        for p in inspect.signature(lightning_ig.integrated_gradients).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    cuda_graph = inspect.Parameter(
        "cuda_graph", inspect.Parameter.KEYWORD_ONLY, default="auto", annotation="bool | Literal['auto']"
    )
    return (*options, cuda_graph)


_registered = iter(range(1_000_000))


def _model_name(folder: Path) -> dict[str, Any]:
    return {"name": f"OptionTypesModel{next(_registered)}"}  # a fresh name per call: register_model refuses a taken one


FORMER_TOP_LEVEL = {
    "quadrature": "lightning_ig.attribution.quadrature",
    "StochasticForwardWarning": "lightning_ig.attribution",
    "target_forward": "lightning_ig.attribution",
    "ConvDuelingQNetwork": "lightning_ig.models",
    "MinAtarQNetwork": "lightning_ig.models",
    "NatureQNetwork": "lightning_ig.models",
    "register_model": "lightning_ig.models",
    "build_model": "lightning_ig.models",
    "EnsembleReduce": "lightning_ig.ensemble",
    "ensemble_reduce": "lightning_ig.ensemble",
    "ensemble_summary": "lightning_ig.run",
    "build_report": "lightning_ig.views",
    "feature_statistics": "lightning_ig.views",
    "completeness_summary": "lightning_ig.views",
    "SCHEMA_VERSION": "lightning_ig.views",
    "LoadedCheckpoint": "lightning_ig.checkpoint",
    "list_heads": "lightning_ig.checkpoint",
    "load_states": "lightning_ig.checkpoint",
    "save_merged_checkpoint": "lightning_ig.checkpoint",
}
"""Names the top level exported once, each exported by its wing now: covered as the top level's are."""


def _public() -> dict[str, Any]:
    """What a user imports: ``lightning_ig.__all__``, and the names its wings export in place of the top level."""
    import importlib

    public = {name: getattr(lightning_ig, name) for name in lightning_ig.__all__}
    for name, wing in FORMER_TOP_LEVEL.items():
        public[name] = getattr(importlib.import_module(wing), name)
    return public


def entry_points() -> list[Entry]:
    """Every public callable with a valid call; options are added to that call one at a time."""
    L = types.SimpleNamespace(**_public())
    q, states = _q, _STATES
    engine_options = _engine_options()
    return [
        Entry(
            "integrated_gradients",
            L.integrated_gradients,
            lambda tmp: {"forward": _value, "inputs": states, "n_steps": 4},
        ),
        Entry("IntegratedGradients", L.IntegratedGradients, lambda tmp: {"forward": _value}, extra=engine_options),
        Entry(
            "IntegratedGradients.attribute",
            L.IntegratedGradients.attribute,
            lambda tmp: {"inputs": states},
            owner=lambda: L.IntegratedGradients(_value, n_steps=4),
            extra=engine_options,
        ),
        Entry("IGResult.grouped", L.IGResult.grouped, lambda tmp: {"groups": "features"}, owner=_result),
        Entry("target_forward", L.target_forward, lambda tmp: {"model": q()}),
        Entry("quadrature", quadrature, lambda tmp: {"method": "gausslegendre", "n": 4}),
        Entry("NoisyLinear", L.NoisyLinear, lambda tmp: {"in_features": 4, "out_features": 2}),
        Entry("NoisyLinear.reset_noise", L.NoisyLinear.reset_noise, _none, owner=lambda: L.NoisyLinear(4, 2)),
        Entry("noise_disabled", _entered(L.noise_disabled), lambda tmp: {"module": q()}),
        Entry("IntegratedGradientsCallback", L.IntegratedGradientsCallback, lambda tmp: {"states": states}),
        Entry(
            "build_report",
            build_report,
            lambda tmp: {"result": _result(), "feature_names": None, "forward_target": "mean"},
        ),
        Entry("feature_statistics", L.feature_statistics, lambda tmp: {"attributions": torch.ones(3, 4)}),
        Entry("completeness_summary", completeness_summary, lambda tmp: {"result": _result()}),
        Entry(
            "FeatureGroups",
            L.FeatureGroups,
            lambda tmp: {"ids": torch.tensor([0, 0, 1, 1]), "names": ["a", "b"], "feature_shape": (4,)},
        ),
        Entry(
            "FeatureGroups.resolve",
            L.FeatureGroups.resolve,
            lambda tmp: {"groups": {"a": [0, 1]}, "feature_shape": (4,)},
        ),
        Entry("FeatureGroups.features", L.FeatureGroups.features, lambda tmp: {"feature_shape": (4,)}),
        Entry("FeatureGroups.channels", L.FeatureGroups.channels, lambda tmp: {"feature_shape": (2, 3, 3)}),
        Entry(
            "FeatureGroups.renamed",
            L.FeatureGroups.renamed,
            lambda tmp: {"names": ["first", "rest"]},
            owner=lambda: L.FeatureGroups.resolve({"a": [0, 1]}, (4,)),
        ),
        Entry("FeatureGroups.blocks", L.FeatureGroups.blocks, lambda tmp: {"feature_shape": (4,), "size": 2}),
        Entry(
            "FeatureGroups.members",
            L.FeatureGroups.members,
            lambda tmp: {"group": 1},
            owner=lambda: L.FeatureGroups.resolve("features", (4,)),
        ),
        Entry("soft_margin_loss", L.soft_margin_loss, lambda tmp: {"input": torch.zeros(3), "target": torch.ones(3)}),
        Entry("SoftMarginLoss", L.SoftMarginLoss, _none),
        Entry("swap_soft_margin", L.swap_soft_margin, lambda tmp: {"module": q()}),
        Entry(
            "ensemble_reduce",
            L.ensemble_reduce,
            lambda tmp: {"logits": torch.zeros(2, 3, 4), "weights": torch.ones(3) / 3},
        ),
        Entry("EnsembleReduce", L.EnsembleReduce, lambda tmp: {"weights": 3}),
        Entry("Ensemble", L.Ensemble, lambda tmp: {"members": [q(), q()]}),
        Entry("Ensemble.reset_noise", L.Ensemble.reset_noise, _none, owner=lambda: L.Ensemble([q()])),
        Entry(
            "ensemble_summary", L.ensemble_summary, lambda tmp: {"aggregate": _result(), "members": _members_result()}
        ),
        Entry("save_checkpoint", L.save_checkpoint, lambda tmp: {"model": q(), "path": tmp / "saved.safetensors"}),
        Entry(
            "save_merged_checkpoint",
            save_merged_checkpoint,
            lambda tmp: {"heads": {"a": q(), "b": q()}, "path": tmp / "merged.safetensors"},
        ),
        Entry("load_checkpoint", L.load_checkpoint, lambda tmp: {"path": _checkpoint(tmp)}),
        Entry("list_heads", list_heads, lambda tmp: {"path": _checkpoint(tmp)}),
        Entry("load_states", load_states, lambda tmp: {"path": _checkpoint(tmp)}),
        Entry("DuelingQNetwork", L.DuelingQNetwork, lambda tmp: {"state_dim": 4, "num_actions": 2}),
        Entry(
            "DuelingQNetwork.reset_noise", L.DuelingQNetwork.reset_noise, _none, owner=lambda: L.DuelingQNetwork(4, 2)
        ),
        Entry("ConvDuelingQNetwork", L.ConvDuelingQNetwork, lambda tmp: {"input_shape": (2, 5, 5), "num_actions": 2}),
        Entry(
            "ConvDuelingQNetwork.reset_noise",
            L.ConvDuelingQNetwork.reset_noise,
            _none,
            owner=lambda: L.ConvDuelingQNetwork((2, 5, 5), 2),
        ),
        Entry("MinAtarQNetwork", L.MinAtarQNetwork, _none),
        Entry("NatureQNetwork", L.NatureQNetwork, _none),
        Entry("register_model", L.register_model, _model_name),
        Entry(
            "build_model",
            build_model,
            lambda tmp: {"name": "DuelingQNetwork", "config": {"state_dim": 4, "num_actions": 2}},
        ),
    ]


def _entered(context: Callable[..., Any]) -> Callable[..., Any]:
    """A context manager's function, entered: its arguments are checked when the block starts."""

    @functools.wraps(context)
    def enter(**options: Any) -> Any:
        with context(**options) as value:
            return value

    return enter


EXEMPT: dict[str, str] = {
    "IGResult": "a record the engine fills in and users read; its one method with options, grouped, is covered",
    "LoadedCheckpoint": "a record load_checkpoint fills in and users read",
    "target_forward.target": "covered through integrated_gradients' target, which takes the same forms",
}
"""Callables and parameters not fed wrong values, each with the reason."""


# ------------------------------------------------------------------------------------------------ the cases


def _namespace(target: Callable[..., Any]) -> dict[str, Any]:
    function = getattr(target, "__init__", target) if inspect.isclass(target) else target
    namespace = dict(vars(typing))
    namespace.update(getattr(inspect.unwrap(function), "__globals__", {}))
    return namespace


def _parameters(entry: Entry) -> Iterator[inspect.Parameter]:
    for parameter in inspect.signature(entry.target).parameters.values():
        if parameter.name in ("self", "cls"):
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            yield from entry.extra
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            yield parameter


def _cases() -> Iterator[Any]:
    for entry in entry_points():
        namespace = _namespace(entry.target)
        for parameter in _parameters(entry):
            if f"{entry.name}.{parameter.name}" in EXEMPT:
                continue
            kinds = kinds_of(parameter.annotation, namespace)
            if parameter.default is None:
                kinds |= {"none"}
            if "any" in kinds:
                continue
            for label, value in CANDIDATES:
                if not any(accepts(kind, value) for kind in kinds):
                    yield pytest.param(entry, parameter.name, value, id=f"{entry.name}-{parameter.name}-{label}")


CASES = list(_cases())


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("option_types")


@pytest.mark.parametrize("entry", entry_points(), ids=lambda entry: entry.name)
def test_the_valid_call_of_each_entry_point_works(entry: Entry, workspace: Path) -> None:
    entry.call(workspace, {})  # the base every wrong value below is added to


@pytest.mark.parametrize(("entry", "name", "value"), CASES)
def test_a_wrong_kind_is_refused_naming_the_option(entry: Entry, name: str, value: Any, workspace: Path) -> None:
    with pytest.raises((TypeError, ValueError)) as caught:
        entry.call(workspace, {name: value})
    assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", str(caught.value)), (
        f"{entry.name}({name}={value!r}) raised {type(caught.value).__name__} without naming {name!r}: {caught.value}"
    )


def test_every_public_callable_is_covered() -> None:
    covered = {entry.name for entry in entry_points()} | set(EXEMPT)
    missing = []
    for name, value in _public().items():
        if inspect.isclass(value) and issubclass(value, (BaseException, Warning)):
            continue  # raised, not called with options
        if inspect.isfunction(value) and name not in covered:
            missing.append(name)
        if not inspect.isclass(value):
            continue
        if name not in covered:
            missing.append(name)
        for attribute, member in vars(value).items():
            if attribute.startswith("_") or not _takes_options(member) or name in EXEMPT:
                continue
            if f"{name}.{attribute}" not in covered:
                missing.append(f"{name}.{attribute}")
    assert not missing, f"give these a row in entry_points() (or a reason in EXEMPT): {missing}"


def test_the_generated_cases_reach_every_kind_of_option() -> None:
    # A guard on the generator itself: if annotations stopped resolving, every option would read as "any"
    # and nothing would be tested.
    names = {case.values[1] for case in CASES}
    expected = (
        "run_at_train_end",
        "log_histograms",
        "group_names",
        "n_steps",
        "completeness_tol",
        "sigma0",
        "feature_names",
        "reduce_dim",
        "backend",
        "max_steps",
        "cuda_graph",
        "metadata",
        "names",
    )
    for option in expected:
        assert option in names, option
    assert len(CASES) > 400


_LIGHTNING_HOOKS = {"setup", "teardown", "state_dict", "load_state_dict"}


def _takes_options(member: Any) -> bool:
    """A public method that takes options: a classmethod, or one with a parameter that has a default."""
    if isinstance(member, (classmethod, staticmethod)):
        return True
    if not inspect.isfunction(member) or member.__name__ in _LIGHTNING_HOOKS or member.__name__.startswith("on_"):
        return False
    return any(p.default is not inspect.Parameter.empty for p in inspect.signature(member).parameters.values())


# ------------------------------------------------------------------------------------------------ the command line


def _typed_flags() -> Iterator[tuple[str, argparse.Action]]:
    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for command, sub in commands.choices.items():
        for action in sub._actions:
            if action.option_strings and (action.type is not None or action.choices is not None):
                yield command, action


_WRONG_TEXT = ["abc", "", "1.5", "-5", "nan", "inf", "1e400", "9" * 5000, "[" * 100000, '{"a": ' * 50000]

# What each flag's type takes; a new typed flag needs a line here (the test below says so).
_FLAG_ACCEPTS: dict[str, Callable[[str], bool]] = {
    "--auto-samples": lambda text: _whole(text, 1),
    "--top-k": lambda text: _whole(text, 1),
    "--top": lambda text: _whole(text, 1),
    "--internal-batch-size": lambda text: _whole(text, 1),
    "--worst-states": lambda text: _whole(text, 0),
    "--seed": lambda text: _whole(text, 0),
    "--num-steps": lambda text: text == "auto" or _whole(text, 1),
    "--completeness-tol": lambda text: _is_float(text) and math.isfinite(float(text)) and float(text) > 0,
    "--target": lambda text: text in ("mean", "each", "contrast") or _whole(text.removeprefix("action:"), 0),
    "--model": lambda text: bool(re.fullmatch(r"[\w.]+:[\w.]+", text)),
    "--lightning-module": lambda text: bool(re.fullmatch(r"[\w.]+:[\w.]+", text)),
    "--model-kwargs": lambda text: text.startswith("{") and text.endswith("}"),
    "--verify": lambda text: _whole(text, 1),
    "--method": lambda text: False,  # none of the wrong texts is a rule's name
}


def _whole(text: str, low: int) -> bool:
    """A whole number >= ``low`` that a count or an index can be (up to 2**63 - 1)."""
    return text.isdigit() and len(text) < 19 and int(text) >= low


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _flag_cases() -> Iterator[Any]:
    for command, action in _typed_flags():
        flag = max(action.option_strings, key=len)
        for text in _WRONG_TEXT:
            takes = _FLAG_ACCEPTS.get(flag, lambda text: False)
            accepted = text in action.choices if action.choices is not None else takes(text)
            if not accepted:
                label = text if len(text) < 12 else f"{text[:3]}...({len(text)} chars)"
                yield pytest.param(command, flag, text, id=f"{command}-{flag}-{label}")


def test_every_typed_flag_says_what_it_takes() -> None:
    missing = [
        flag
        for _, action in _typed_flags()
        if action.choices is None
        for flag in [max(action.option_strings, key=len)]
        if flag not in _FLAG_ACCEPTS
    ]
    assert not missing, f"add what these flags take to _FLAG_ACCEPTS: {missing}"


@pytest.mark.parametrize(("command", "flag", "text"), list(_flag_cases()))
def test_a_wrong_flag_value_exits_2_naming_the_flag(
    command: str, flag: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    required = ["--checkpoint", "missing.safetensors"] if command == "diag" else ["missing.json"]
    status = main([command, *required, f"{flag}={text}"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert flag in err and len(err.strip().splitlines()) == 1, err
    assert len(err) < 1000  # the value is quoted cut short, not 100000 characters of it

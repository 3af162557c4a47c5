"""The callback's options, each checked once when the callback is made (:class:`Options`), fixed afterwards.

Every argument of :class:`~lightning_ig.callback.IntegratedGradientsCallback` (its docstring's ``Args`` say what
each means) is a field of :class:`Options`, checked in ``__post_init__`` before any training: with
:mod:`lightning_ig.vocabulary`'s checks, :mod:`lightning_ig.callback.heldout`'s (states, baseline, target) and this
module's (the cadences, the action names, the name); the engine's and the views' knobs are checked by their own
classes (:class:`~lightning_ig.attribution.IGOptions`, :class:`~lightning_ig.views.ViewOptions`). What can only be
checked against the states or the model (their shape, a channel past the channels, the report folder) is checked at
set-up. The callback reads its options as attributes (:func:`option_attribute`) and refuses to have them assigned
(:func:`option_assignment`): a fit is set up from them once.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_ig.attribution import IGOptions
from lightning_ig.attribution.groups import GroupSpec, check_group_spec
from lightning_ig.attribution.targets import Target
from lightning_ig.callback import heldout
from lightning_ig.views import ViewOptions
from lightning_ig.vocabulary import (
    callable_name,
    check_bool,
    check_choice,
    check_names,
    check_optional_positive_int,
    check_path,
    check_positive_float,
    shown,
    shown_with_type,
)

__all__ = ["Options", "option_assignment", "option_attribute"]


@dataclass(frozen=True)
class Options:
    """The callback's options as checked: one field per argument of the callback, under its name."""

    states: Any
    every_n_steps: int | None
    every_n_epochs: int | None
    run_at_train_end: bool
    feature_names: list[str] | None
    feature_groups: GroupSpec | None
    group_names: list[str] | None
    action_names: list[str] | None
    baseline: Any
    target: Target
    forward: Any
    completeness_tol: float
    on_non_finite: Literal["warn", "raise"]
    report_dir: Path | None
    name: str | None
    engine: IGOptions
    views: ViewOptions
    overhead: float | None

    def __post_init__(self) -> None:
        """Check every field, in the order of the callback's arguments, and keep it as checked.

        Raises:
            MisconfigurationException: no cadence, or a non-positive one.
            TypeError, ValueError: a bad argument (the message names it); a value of the wrong kind is refused,
                never read as another.
        """
        checked = object.__setattr__
        checked(self, "states", heldout.check_states_source(self.states))
        checked(self, "every_n_steps", _check_cadence(self.every_n_steps, "every_n_steps"))
        checked(self, "every_n_epochs", _check_cadence(self.every_n_epochs, "every_n_epochs"))
        if self.every_n_steps is None and self.every_n_epochs is None:
            raise MisconfigurationException(
                "IntegratedGradientsCallback needs a cadence: set every_n_steps (e.g. 100) and/or every_n_epochs "
                "(e.g. 1); both are None"
            )
        checked(self, "run_at_train_end", check_bool(self.run_at_train_end, "run_at_train_end"))
        checked(self, "feature_names", _optional_names(self.feature_names, "feature_names"))
        checked(self, "feature_groups", check_group_spec(self.feature_groups))  # against the states at set-up
        checked(self, "group_names", _optional_names(self.group_names, "group_names"))
        checked(self, "baseline", heldout.check_baseline(self.baseline))
        target, forward = heldout.check_target(self.target, self.forward)
        checked(self, "target", target)
        checked(self, "forward", forward)
        checked(self, "action_names", _check_action_names(self.action_names, target, forward))
        checked(self, "completeness_tol", check_positive_float(self.completeness_tol, "completeness_tol"))
        checked(self, "on_non_finite", check_choice(self.on_non_finite, ("warn", "raise"), "on_non_finite"))
        checked(self, "report_dir", None if self.report_dir is None else check_path(self.report_dir, "report_dir"))
        checked(self, "name", _check_name(self.name))
        checked(self, "engine", _check_engine(self.engine, self.completeness_tol))
        checked(self, "views", _check_group(self.views, ViewOptions, "views"))
        checked(self, "overhead", _check_overhead(self.overhead))

    def identity(self) -> dict[str, Any]:
        """What tells this callback's state apart in a checkpoint (Lightning's ``state_key``): the name and what is
        attributed, not the cadences (a fit resumed at another cadence keeps its history)."""
        target = callable_name(self.forward) if self.forward is not None else self.target.as_given
        return {"name": self.name, "target": target}


_OPTIONS = frozenset(field.name for field in dataclasses.fields(Options))
_ENGINE_DEFAULTS = IGOptions()
_GROUPED = {
    **{field.name: ("engine", IGOptions) for field in dataclasses.fields(IGOptions)},
    **{field.name: ("views", ViewOptions) for field in dataclasses.fields(ViewOptions)},
}


def option_attribute(callback: Any, name: str) -> Any:
    """``callback.every_n_steps`` and every other option read as an attribute: the option as checked
    (``callback.options``); the callback's ``__getattr__`` (asked only for a name it does not hold itself).

    Raises:
        AttributeError: ``name`` is not an option.
    """
    if (options := vars(callback).get("options")) is None or name not in _OPTIONS:
        raise AttributeError(f"{type(callback).__name__!r} object has no attribute {name!r}")
    return getattr(options, name)


def option_assignment(callback: Any, name: str, value: Any) -> None:
    """The callback's ``__setattr__``: an option (or the options, once set) cannot be assigned; anything else can.

    Raises:
        AttributeError: ``name`` is an option of the callback, of its ``engine`` or of its ``views``.
    """
    kind = type(callback).__name__
    if name in _OPTIONS or (name == "options" and "options" in vars(callback)):
        raise AttributeError(
            f"{kind}.{name} is fixed when the callback is made (its fit is set up from it): create a new "
            f"{kind}(..., {name}=...) instead of assigning {shown(value, 40)}"
        )
    if name in _GROUPED:
        group, cls = _GROUPED[name]
        raise AttributeError(
            f"{name} is an option of the callback's {group}= ({cls.__name__}), fixed when the callback is made: create "
            f"a new {kind}(..., {group}=dataclasses.replace(callback.{group}, {name}={shown(value, 40)}))"
        )
    object.__setattr__(callback, name, value)


def _check_cadence(value: Any, name: str) -> int | None:
    """``None`` or an int >= 1 (numpy ints too); a non-positive one is Lightning's error."""
    try:
        return check_optional_positive_int(value, name)
    except ValueError as error:
        raise MisconfigurationException(f"{error}; e.g. {name}=100") from None


def _check_overhead(value: Any) -> float | None:
    """``None`` or a fraction of the fit's wall time in ``(0, 1]`` (``TypeError`` or ``ValueError`` otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"overhead must be None or a fraction of the fit's wall time (e.g. 0.02 for 2%), got "
            f"{shown_with_type(value)}"
        )
    if not 0 < float(value) <= 1:
        raise ValueError(
            f"overhead must be a fraction of the fit's wall time in (0, 1] (e.g. 0.02 for 2%), got {shown(value)}; "
            "pass None for no budget (every run in full, no trust checks)"
        )
    return float(value)


def _optional_names(names: Any, name: str) -> list[str] | None:
    return None if names is None else check_names(names, name)


def _check_action_names(names: Any, target: Target, forward: Any) -> list[str] | None:
    """``None`` or one name per action, for a target about actions (``"each"``, ``"contrast"``, an output index);
    counted against the model's outputs at fit start (:meth:`~lightning_ig.attribution.targets.Target.bind`).

    Raises:
        TypeError: not a sequence of strings.
        ValueError: names for a target that attributes no action (``"mean"``, a callable, ``forward=``).
    """
    if names is None:
        return None
    checked = check_names(names, "action_names")
    if forward is not None or not target.about_actions:
        given = "forward=" if forward is not None else f"target={shown(target.as_given, 40)}"
        raise ValueError(
            f"action_names label the actions of target='each', 'contrast' or an output index; with {given} no action "
            f"is attributed: drop action_names (got {len(checked)} names)"
        )
    return checked


def _check_name(name: Any) -> str | None:
    """``None`` or a short printable label without ``/`` (the tags go under ``ig/<name>/``)."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be None or a short label (a string), got {shown_with_type(name)}")
    if name is not None and (not name.strip() or not name.isprintable() or any(c in name for c in "/\\")):
        raise ValueError(  # say which rule: blank and unprintable names were told only "without '/'"
            f"name must be a short printable label, not blank and without '/' or '\\' (tags go under ig/<name>/), "
            f"e.g. name='value'; got {shown(name)}"
        )
    return name


def _check_group(value: Any, cls: type, name: str) -> Any:
    """``None`` (the defaults) or an instance of ``cls``, checked when it was made."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        fix = f" (a dict's fields: {cls.__name__}(**fields))" if isinstance(value, dict) else ""  # a config file's
        raise TypeError(f"{name} must be None or {cls.__name__}(...){fix}, got {shown_with_type(value)}")
    return value


def _check_engine(engine: Any, completeness_tol: float) -> IGOptions:
    """The engine's options with the callback's ``completeness_tol`` (the verdict's tolerance and ``"auto"``'s
    target): one tolerance, never two that disagree.

    Raises:
        TypeError: not ``None`` or an :class:`~lightning_ig.attribution.IGOptions`.
        ValueError: ``engine.completeness_tol`` set to another value than the callback's.
    """
    options = _check_group(engine, IGOptions, "engine")
    if options.completeness_tol not in (_ENGINE_DEFAULTS.completeness_tol, completeness_tol):
        raise ValueError(
            f"engine=IGOptions(completeness_tol={options.completeness_tol!r}) disagrees with the callback's "
            f"completeness_tol={completeness_tol!r}, the one tolerance of the verdict and of n_steps='auto': pass "
            f"completeness_tol={options.completeness_tol!r} to the callback"
        )
    return dataclasses.replace(options, completeness_tol=completeness_tol)

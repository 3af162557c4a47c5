"""The callback's options, each checked once when the callback is made: :func:`check_options` -> :class:`Options`.

Every argument of :class:`~lightning_ig.callback.IntegratedGradientsCallback` (its docstring's ``Args`` say what
each means) is checked here, before any training: the shared checks are :mod:`lightning_ig.vocabulary`'s and
:mod:`lightning_ig.callback.heldout`'s (states, baseline, target), the ones only the callback has are this module's
(:func:`check_cadences`, :func:`check_saliency_channel_index`, :func:`check_name`). What can only be checked
against the states or the model (their shape, a channel index past the channels, the report folder) is checked at
set-up (:mod:`lightning_ig.callback.setup`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_ig.attribution.groups import GroupSpec, check_group_spec
from lightning_ig.attribution.targets import Target
from lightning_ig.callback import heldout
from lightning_ig.vocabulary import (
    BACKENDS,
    GRADIENTS,
    callable_name,
    check_bool,
    check_choice,
    check_method,
    check_n_steps,
    check_names,
    check_optional_positive_int,
    check_path,
    check_positive_float,
    check_positive_int,
    shown,
)

__all__ = [
    "Options",
    "check_action_names",
    "check_cadence",
    "check_cadences",
    "check_name",
    "check_options",
    "check_saliency_channel_index",
    "option_attribute",
]


@dataclass(frozen=True)
class Options:
    """The callback's options as checked (one field per argument of the callback, under its name)."""

    states: Any
    every_n_steps: int | None
    every_n_epochs: int | None
    run_at_train_end: bool
    feature_names: list[str] | None
    baseline: Any
    target: Target
    forward: Any
    n_steps: Any
    method: str
    gradient: str
    backend: str
    internal_batch_size: int | None
    top_k: int
    completeness_tol: float
    report_dir: Path | None
    log_histograms: bool
    figure_every_n_runs: int | None
    name: str | None
    feature_groups: GroupSpec | None
    group_names: list[str] | None
    max_logged_features: int
    saliency_states: int | None
    saliency_channel: int | None
    saliency_every_n_runs: int
    on_non_finite: str
    checks_every_n_runs: int | None
    action_names: list[str] | None

    def identity(self) -> dict[str, Any]:
        """What tells this callback's state apart in a checkpoint (Lightning's ``state_key``): the name, what is
        attributed and the cadences."""
        target = callable_name(self.forward) if self.forward is not None else self.target.as_given
        return {
            "name": self.name,
            "target": target,
            "every_n_steps": self.every_n_steps,
            "every_n_epochs": self.every_n_epochs,
        }


_OPTION_NAMES = frozenset(field.name for field in fields(Options))


def check_options(given: Mapping[str, Any]) -> Options:
    """The callback's arguments (by name, as ``__init__`` received them), each checked.

    Raises:
        MisconfigurationException: no cadence, or a non-positive one.
        TypeError, ValueError: a bad argument (the message names it); a value of the wrong kind is refused, never
            read as another.
    """
    states = heldout.check_states_source(given["states"])
    every_n_steps, every_n_epochs = check_cadences(given["every_n_steps"], given["every_n_epochs"])
    run_at_train_end, names = check_bool(given["run_at_train_end"], "run_at_train_end"), given["feature_names"]
    feature_names = None if names is None else check_names(names, "feature_names")
    baseline = heldout.check_baseline(given["baseline"])
    target, forward = heldout.check_target(given["target"], given["forward"])
    report_dir, group_names = given["report_dir"], given["group_names"]
    return Options(
        states=states,
        every_n_steps=every_n_steps,
        every_n_epochs=every_n_epochs,
        run_at_train_end=run_at_train_end,
        feature_names=feature_names,
        baseline=baseline,
        target=target,
        forward=forward,
        n_steps=check_n_steps(given["n_steps"]),
        method=check_method(given["method"]),
        gradient=check_choice(given["gradient"], GRADIENTS, "gradient"),
        backend=check_choice(given["backend"], BACKENDS, "backend"),
        internal_batch_size=check_optional_positive_int(given["internal_batch_size"], "internal_batch_size"),
        top_k=check_positive_int(given["top_k"], "top_k"),
        completeness_tol=check_positive_float(given["completeness_tol"], "completeness_tol"),
        report_dir=None if report_dir is None else check_path(report_dir, "report_dir"),
        log_histograms=check_bool(given["log_histograms"], "log_histograms"),
        figure_every_n_runs=check_optional_positive_int(given["figure_every_n_runs"], "figure_every_n_runs"),
        name=check_name(given["name"]),
        feature_groups=check_group_spec(given["feature_groups"]),  # checked against the states' shape at set-up
        group_names=None if group_names is None else check_names(group_names, "group_names"),
        max_logged_features=check_positive_int(given["max_logged_features"], "max_logged_features", example=64),
        saliency_states=check_optional_positive_int(given["saliency_states"], "saliency_states"),
        saliency_channel=check_saliency_channel_index(given["saliency_channel"]),
        saliency_every_n_runs=check_positive_int(given["saliency_every_n_runs"], "saliency_every_n_runs", example=10),
        on_non_finite=check_choice(given["on_non_finite"], ("warn", "raise"), "on_non_finite"),
        checks_every_n_runs=check_optional_positive_int(given["checks_every_n_runs"], "checks_every_n_runs"),
        action_names=check_action_names(given["action_names"], target, forward),
    )


def option_attribute(callback: Any, name: str) -> Any:
    """``callback.every_n_steps`` and every other option read as an attribute: the option as checked
    (``callback.options``); the callback's ``__getattr__`` (asked only for a name it does not hold itself).

    Raises:
        AttributeError: ``name`` is not an option.
    """
    options = vars(callback).get("options")
    if options is None or name not in _OPTION_NAMES:
        raise AttributeError(f"{type(callback).__name__!r} object has no attribute {name!r}")
    return getattr(options, name)


def check_cadence(value: int | None, name: str) -> int | None:
    """``None`` or an int >= 1 (``every_n_steps``, ``every_n_epochs``); a non-positive one is Lightning's error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be a positive int or None, got {type(value).__name__} ({shown(value)}); e.g. {name}=100"
        )
    if value < 1:
        raise MisconfigurationException(f"{name} must be a positive int or None, got {value!r}; e.g. {name}=100")
    return value


def check_cadences(every_n_steps: int | None, every_n_epochs: int | None) -> tuple[int | None, int | None]:
    """The two cadences, each ``None`` or an int >= 1, and at least one of them given."""
    steps, epochs = check_cadence(every_n_steps, "every_n_steps"), check_cadence(every_n_epochs, "every_n_epochs")
    if steps is None and epochs is None:
        raise MisconfigurationException(
            "IntegratedGradientsCallback needs a cadence: set every_n_steps (e.g. 100) and/or every_n_epochs (e.g. "
            "1); both are None"
        )
    return steps, epochs


def check_action_names(names: Any, target: Target, forward: Any) -> list[str] | None:
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


def check_saliency_channel_index(value: int | None) -> int | None:
    """``None`` (the channel mean) or a channel index >= 0; checked against the states' channels at set-up."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        error = ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError
        raise error(f"saliency_channel must be None (the channel mean) or a channel index >= 0, got {shown(value)}")
    return value


def check_name(name: str | None) -> str | None:
    """``None`` or a short printable label without ``/`` (the tags go under ``ig/<name>/``)."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be None or a short label (a string), got {type(name).__name__} ({shown(name)})")
    if name is not None and (not name.strip() or not name.isprintable() or any(c in name for c in "/\\")):
        raise ValueError(f"name must be a short label without '/' (tags go under ig/<name>/), got {shown(name)}")
    return name

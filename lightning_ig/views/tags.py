"""What a callback logs: how much (:class:`ViewOptions`), its tags (:class:`TagNames`), the pictures' tags, and how
names are shown.

Names appear the same way in tags, charts and text (:func:`display_labels`): a user's names as given (a ``/``
would nest the tag, so it becomes ``∕``), generated names (``x[0,3,9]``, ``channel 3``) with their numbers
zero-padded so that they sort numerically. Every tag is listed, once, in ``docs/tensorboard-tags.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lightning_ig.vocabulary import check_bool, check_int, check_optional_positive_int, check_positive_int

__all__ = [
    "CONCENTRATION_TWIN",
    "COUNT_TAGS",
    "PICTURES",
    "PICTURE_TAGS",
    "TAG_ROOT",
    "TagNames",
    "ViewOptions",
    "display_labels",
    "same_concentrations",
]

TAG_ROOT = "ig"


@dataclass(frozen=True)
class ViewOptions:
    """What the callback's runs log and draw (its ``views=``): checked when made, read-only afterwards
    (``dataclasses.replace`` makes a changed copy, checked again). When each picture is drawn, and what each tag
    holds: ``docs/tensorboard-tags.md``.

    Args:
        top_k: entries of the top-k table and chart and of the Jaccard drift (default 10).
        log_histograms: log per-feature / per-group histograms (default ``True``).
        figure_every_n_runs: draw the charts (the verdict card, the shares over training, ``actions``) at the first
            run, every this many runs and at the end (default 10; the verdict card also at every run that failed
            or whose verdict differs from the last one drawn); ``None``: never.
        max_logged_features: the most features logged one by one (default 64); beyond it, groups (``"channels"``
            for ``(C, ...)`` states, else blocks) unless the callback's ``feature_groups`` names them. More
            ``feature_groups`` than this are not logged one by one either (the cards, text and reports rank them).
        saliency_states: held-out states in the saliency grid of spatial states (default 5, the most frames that fit
            TensorBoard's card at 8 px per MinAtar cell: more are drawn only as the strips of ``(C, L)`` signals;
            ``None``: no saliency grid).
        saliency_channel: the one channel drawn under the attribution's squares (default ``None``: every channel
            in its colour); checked against the states' channels at set-up.
        saliency_every_n_runs: draw the saliency grid at the first run, every this many runs and at the end
            (default 10; 1: every run). Pictures that share a cadence are spread over it.

    Raises:
        TypeError: a value of the wrong kind (the message names the option).
        ValueError: a count below 1 or a negative channel.

    Example::

        IntegratedGradientsCallback(states, views=ViewOptions(top_k=5, saliency_every_n_runs=1))
    """

    top_k: int = 10
    log_histograms: bool = True
    figure_every_n_runs: int | None = 10
    max_logged_features: int = 64
    saliency_states: int | None = 5
    saliency_channel: int | None = None
    saliency_every_n_runs: int = 10

    def __post_init__(self) -> None:
        channel = self.saliency_channel
        checked = {
            "top_k": check_positive_int(self.top_k, "top_k", example=10),
            "log_histograms": check_bool(self.log_histograms, "log_histograms"),
            "figure_every_n_runs": check_optional_positive_int(self.figure_every_n_runs, "figure_every_n_runs"),
            "max_logged_features": check_positive_int(self.max_logged_features, "max_logged_features", example=64),
            "saliency_states": check_optional_positive_int(self.saliency_states, "saliency_states"),
            "saliency_channel": None if channel is None else check_int(channel, "saliency_channel", minimum=0),
            "saliency_every_n_runs": check_positive_int(
                self.saliency_every_n_runs, "saliency_every_n_runs", example=10
            ),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # a frozen dataclass: each field as checked


PICTURE_TAGS = {
    "verdict": "0_verdict",  # the first card under ig/ (Time Series sorts by tag): the verdict, what it relies on
    "shares": "1_over_training",  # what it relies on over training, under every run's verdict
    "saliency": "2_saliency",  # spatial states: held-out frames with the signed attribution of each cell, at 1.0x
    "actions": "3_actions",  # target="each" or "contrast": why this action
}
"""Each kind of picture a run may draw and its tag under the callback's prefix (``ig/<tag>``), in page order."""

PICTURES = tuple(PICTURE_TAGS)
"""The kinds of picture, in the order a run's pictures are spread over their cadence (``outputs.pictures_due``)."""

COUNT_TAGS = ("completeness/non_finite_states", "completeness/degenerate_states", "completeness/near_baseline_states")
"""Scalars that count states: logged from the first run where they are non-zero (``informative_scalars``)."""
CONCENTRATION_TWIN = "concentration/top10pct_share"
"""The concentration that equals the top-1% one when a state has at most 10 features (:func:`same_concentrations`)."""


def display_labels(names: Sequence[str], *, generated: bool = False) -> list[str]:
    """How names appear in tags, charts and text.

    Args:
        names: feature or group names (distinct).
        generated: the names were made up by lightning-ig (``x[0,3,9]``, ``channel 3``, ``x0..x7``): their numbers are
            zero-padded to one width so that ``x[0,03,09]`` sorts before ``x[0,10,02]`` as text.

    Returns:
        One distinct label per name.

    Example::

        >>> display_labels(["pole/angle", "cart x"])
        ['pole∕angle', 'cart x']
        >>> display_labels(["x[0,3]", "x[0,10]"], generated=True)
        ['x[00,03]', 'x[00,10]']
    """
    labels = [str(name).replace("/", "∕") for name in names]
    if generated:
        width = max((len(run) for label in labels for run in re.findall(r"\d+", label)), default=1)
        labels = [re.sub(r"\d+", lambda match: match.group().zfill(width), label) for label in labels]
    seen: set[str] = set()
    for index, label in enumerate(labels):
        if label in seen:
            labels[index] = f"{label} ({index})"
        seen.add(labels[index])
    return labels


@dataclass(frozen=True)
class TagNames:
    """The tags of one callback: ``ig/...``, or ``ig/<name>/...`` for a named callback.

    Attributes:
        prefix: ``"ig"`` or ``"ig/<name>"``.
        feature_labels: labels of the features logged one by one (``None``: too many to log).
        group_labels: labels of the groups (``None``: no groups).
        num_features: the features of one state (the top-10% concentration is logged when there are more than 10).
        action_labels: with ``target="each"``, one label per action (``<prefix>/action/<action>/...`` tags); else
            ``None``.
        action_units: with ``target="each"``, log each action's mean ``|attr|`` per unit too (few enough).
        group_units: log each group's scalars and histogram (at most ``max_logged_features`` groups).
        labels: the labels of each kind of unit that has them, by :attr:`~lightning_ig.run.summary.Units.kind`
            (``"features"``, ``"groups"``). Set here, with the two below, when the tags are made (at fit start), so
            that a run reads its tags as plain data.
        count_tags: the full tags of :data:`COUNT_TAGS`.
        concentration_twin: the full tag of :data:`CONCENTRATION_TWIN` where it equals the top-1% share
            (:func:`same_concentrations`), else ``None``.
    """

    prefix: str
    feature_labels: list[str] | None
    group_labels: list[str] | None
    num_features: int = 0
    action_labels: list[str] | None = None
    action_units: bool = False
    group_units: bool = True
    labels: Mapping[str, list[str]] = field(init=False, repr=False, compare=False)
    count_tags: frozenset[str] = field(init=False, repr=False, compare=False)
    concentration_twin: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kinds = {"features": self.feature_labels, "groups": self.group_labels}
        set_field = object.__setattr__  # a frozen dataclass: its derived fields are set once, here
        set_field(self, "labels", {kind: list(labels) for kind, labels in kinds.items() if labels is not None})
        set_field(self, "count_tags", frozenset(f"{self.prefix}/{name}" for name in COUNT_TAGS))
        twin = f"{self.prefix}/{CONCENTRATION_TWIN}" if same_concentrations(self.num_features) else None
        set_field(self, "concentration_twin", twin)

    @classmethod
    def build(
        cls,
        name: str | None,
        feature_names: Sequence[str] | None,
        group_names: Sequence[str] | None,
        *,
        generated_features: bool,
        generated_groups: bool,
        num_features: int = 0,
        group_units: bool = True,
    ) -> TagNames:
        prefix = TAG_ROOT if name is None else f"{TAG_ROOT}/{display_labels([name])[0]}"
        features = None if feature_names is None else display_labels(feature_names, generated=generated_features)
        groups = None if group_names is None else display_labels(group_names, generated=generated_groups)
        return cls(prefix, features, groups, num_features=int(num_features), group_units=group_units)


def same_concentrations(num_features: int) -> bool:
    """The top-1% and top-10% shares are one number (the largest feature's) when ``ceil(F / 100) == ceil(F / 10)``."""
    return num_features > 0 and math.ceil(0.01 * num_features) == math.ceil(0.1 * num_features)

"""The pictures a run draws, from its summary, its host result and what the callback decided once per fit.

A *picture* is anything logged as an image. The kinds (:data:`~lightning_ig.views.tags.PICTURE_TAGS`):

* ``verdict``: the first card under ``ig/``: the completeness verdict and the top units' shares
  (:mod:`~lightning_ig.views.pictures.verdict_card`);
* ``top_features``: the bar chart, each bar split by sign, with the verdict (:mod:`~lightning_ig.views.pictures.bars`);
* ``heatmap`` and ``shares``: the units' shares of the mean ``|attr|`` over training, as a heatmap and stacked
  (:mod:`~lightning_ig.views.pictures.charts`);
* ``saliency``: the saliency grid of spatial states, the game drawn in its channels' colours with the signed
  attribution over it, and ``saliency_map``: the mean ``|attr|`` map per channel
  (:mod:`~lightning_ig.views.pictures.saliency`);
* ``actions``: why this action, for ``target="each"`` or ``"contrast"``
  (:mod:`~lightning_ig.views.pictures.action_charts`).

Which ones a run draws is :func:`~lightning_ig.views.loggers.outputs.pictures_due`'s decision; this module draws them
(:func:`draw`) and is reached only when one is due. The words that name the target and the baseline in the
pictures are the target's own (:attr:`~lightning_ig.attribution.targets.Target.words`) and :func:`baseline_words`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.run.actions import contrast_numbers, state_rows
from lightning_ig.run.host_result import HostResult
from lightning_ig.run.summary import RunSummary
from lightning_ig.views.pictures.action_charts import action_attributions_chart, contrast_chart
from lightning_ig.views.pictures.bars import MUTED, top_features_chart
from lightning_ig.views.pictures.charts import heatmap_chart, shares_chart
from lightning_ig.views.pictures.raster import card_sized
from lightning_ig.views.pictures.saliency import mean_abs_map, saliency_grid
from lightning_ig.views.pictures.verdict_card import verdict_chart
from lightning_ig.views.pictures.words import TRUST_COLOURS, baseline_words, run_verdict, trust_detail
from lightning_ig.views.text import DRIFT_WORDS

__all__ = [
    "PictureInputs",
    "actions_picture",
    "draw",
    "heatmap_picture",
    "mean_abs_map_picture",
    "picture_inputs",
    "saliency_grid_picture",
    "shares_picture",
    "top_features_picture",
    "verdict_picture",
]


@dataclass(frozen=True)
class PictureInputs:
    """What the pictures need besides a run, decided once per fit.

    Attributes:
        states: ``(B, *feature_shape)`` the held-out states for the saliency pictures (spatial states), or ``None``.
        picked: the indices of the states the saliency grid draws (distinct ones: random play repeats frames).
        presence: ``feature_shape``: the fraction of states where each feature differs from its baseline, for the
            mean ``|attr|`` map averaged where each object is (``baseline="zeros"``), or ``None``.
        channel: the one channel the grid draws (``saliency_channel``), or ``None`` for all.
        channel_names: one name per channel of spatial states (the groups' when they are the channels), or ``None``.
        channel_colours: one ``"#rrggbb"`` per channel, or ``None`` (the default palette).
        unit_colours: one ``"#rrggbb"`` per unit drawn beside its label (the channels' when the groups are
            channels), or ``None``.
        baseline: what the attributions are relative to, in words (:func:`baseline_words`).
        pairs: for ``target="contrast"``, a callable giving ``(B, 2)`` each state's greedy and runner-up actions (run
            only when the ``actions`` picture is drawn); else ``None``.
    """

    states: np.ndarray | None = None
    picked: np.ndarray | None = None
    presence: np.ndarray | None = None
    channel: int | None = None
    channel_names: list[str] | None = None
    channel_colours: list[str] | None = None
    unit_colours: list[str] | None = None
    baseline: str = "the baseline"
    pairs: Callable[[], np.ndarray] | None = None


def picture_inputs(
    states: np.ndarray,
    *,
    saliency_states: int,
    channel: int | None,
    channel_names: Sequence[str] | None,
    groups_are_channels: bool,
    baseline: str,
    spatial: bool,
    pairs: Callable[[], np.ndarray] | None = None,
) -> PictureInputs:
    """What the pictures of a fit need, decided once at its start.

    Args:
        states: ``(B, *feature_shape)`` the held-out states.
        saliency_states: how many states the saliency grid draws (distinct ones, the first of each, in order);
            0 for no grid.
        channel: the one channel the grid draws, or ``None``.
        channel_names: one name per channel (the groups' when they are the channels), or ``None``.
        groups_are_channels: the groups are exactly the channels: the bars get the channels' colours.
        baseline: the baseline option (``"zeros"``, ``"mean"``, or a tensor's label).
        spatial: the states are frames (``(C, H, W)`` or ``(H, W)``).
        pairs: ``(B, 2)`` each state's greedy and runner-up actions, for ``target="contrast"``; ``None`` otherwise.
    """
    from lightning_ig.views.pictures.frames import first_distinct  # noqa: PLC0415 - the drawing modules only when drawn
    from lightning_ig.views.pictures.raster import categorical_colours  # noqa: PLC0415

    array = np.asarray(states, dtype=np.float32)
    picked = first_distinct(array, saliency_states) if spatial and saliency_states > 0 else None
    presence = None
    if spatial and baseline == "zeros":  # attr = (x - 0) * ...: exactly 0 where the object is absent
        presence = (array != 0).mean(axis=0)
    channels = array.shape[1] if spatial and array.ndim == 4 else None
    colours = None if channels is None else categorical_colours(channels)
    return PictureInputs(
        states=array if spatial else None,
        picked=picked,
        presence=presence,
        channel=channel,
        channel_names=None if channel_names is None else list(channel_names),
        channel_colours=colours,
        unit_colours=colours if groups_are_channels else None,
        baseline=baseline_words(baseline, spatial),
        pairs=pairs,
    )


def draw(
    due: Mapping[str, bool],
    summary: RunSummary,
    labels: Sequence[str],
    host: HostResult | None,
    history: Sequence[Mapping[str, Any]],
    inputs: PictureInputs,
    previous_scale: float | None = None,
) -> tuple[dict[str, np.ndarray], float | None]:
    """The pictures ``due`` (``{kind: bool}``).

    Args:
        due: which kinds to draw.
        summary: the run.
        labels: the labels of the run's units (features or groups), as the tags show them.
        host: the run's host result (the saliency and action pictures need it), or ``None`` (charts only).
        history: the runs so far (the heatmap's and the shares').
        inputs: what the callback decided once per fit.
        previous_scale: the last saliency grid's colour scale (a change is pointed out), or ``None``.

    Returns:
        ``{kind: (H, W, 3) uint8}`` and the saliency grid's colour scale (``None`` when no grid was drawn).
    """
    pictures: dict[str, np.ndarray] = {}
    if due.get("verdict"):
        pictures["verdict"] = verdict_picture(summary, labels, inputs)
    if due.get("top_features"):
        pictures["top_features"] = top_features_picture(summary, labels, inputs).pixels
    if due.get("heatmap"):
        pictures["heatmap"] = heatmap_picture(summary, labels, history).pixels
    if due.get("shares"):
        pictures["shares"] = shares_picture(summary, labels, history, inputs)
    scale = None
    if host is not None and inputs.states is not None and due.get("saliency"):
        pictures["saliency"], scale = saliency_grid_picture(host, inputs, summary, previous_scale)
    if host is not None and due.get("saliency_map"):
        pictures["saliency_map"] = mean_abs_map_picture(host, summary, inputs)
    if host is not None and due.get("actions"):
        drawn = actions_picture(summary, labels, inputs)
        if drawn is not None:
            pictures["actions"] = drawn
    # each as high as Time Series' image box: shown at 1.0x there, whatever the window's width (raster.card_sized)
    return {kind: card_sized(pixels) for kind, pixels in pictures.items()}, scale


def _words(summary: RunSummary, inputs: PictureInputs) -> tuple[str, str, str, str]:
    """``(noun, " 'name'", target, states)``: the words every title and label uses."""
    noun = "groups" if summary.units.kind == "groups" else "features"
    name = "" if summary.settings.name is None else f" '{summary.settings.name}'"
    target, states = summary.settings.target, f"{summary.num_states} states"
    if target.rows_per_state > 1:
        states = f"{summary.num_states // target.rows_per_state} states × {target.rows_per_state} actions"
    return noun, name, target.words, states


def verdict_picture(summary: RunSummary, labels: Sequence[str], inputs: PictureInputs) -> np.ndarray:
    """The ``verdict`` card: the completeness verdict and the top units by share, the ranking's drift under it."""
    noun, name, target, states = _words(summary, inputs)
    drift = summary.drift
    footer = None
    if "spearman_prev" in drift:
        first = drift.get("spearman_first", math.nan)
        footer = [
            f"ranking vs the previous run: Spearman {drift['spearman_prev']:.2f}, vs the first {first:.2f}",
            f"{DRIFT_WORDS['spearman_prev']}: {drift['spearman_prev']:.2f}",
            f"rank correlation with the previous run {drift['spearman_prev']:.2f}",
        ]
    colour, detail = MUTED, None
    trust = summary.trust_checks  # the trust checks' verdict leads the footer: a passed card can hide a failed check
    if trust is not None:
        status = str(trust.status)
        mark = {"passed": "✓", "failed": "✗"}.get(status, "?")
        colour = TRUST_COLOURS.get(status, MUTED)
        footer = [f"{mark} trust checks: {trust.headline()}", f"{mark} trust checks {status} (ig/trust/status)"]
        detail = trust_detail(trust)
    prefix = f"IG{name} at step {summary.step:,}"
    titles = [f"{prefix}: {target}, {states}", f"Step {summary.step:,}: {target}, {states}", f"{prefix}: {target}"]
    return verdict_chart(
        list(labels),
        summary.units.moments,
        verdict=run_verdict(summary),
        title=[*titles, prefix],
        target_label=target,
        noun=noun,
        top_k=summary.settings.top_k,
        label_colours=inputs.unit_colours,
        footer=footer,
        footer_colour=colour,
        footer_detail=detail,
    ).pixels


def top_features_picture(summary: RunSummary, labels: Sequence[str], inputs: PictureInputs | None = None) -> Any:
    """The ``top_features`` bar chart of this run, with its completeness verdict (a :class:`~.bars.Chart`)."""
    inputs = inputs or PictureInputs()
    noun, name, target, states = _words(summary, inputs)
    top = min(summary.settings.top_k, len(labels))
    return top_features_chart(
        list(labels),
        summary.units.moments,
        top_k=summary.settings.top_k,
        title=[
            f"Top {top} {noun} by mean |attribution|{name}, step {summary.step:,}",
            f"Top {top} {noun}{name}, step {summary.step:,}",
            f"Top {top} {noun}{name}",
        ],
        value_label=[f"mean |attribution| of {target}, {states}", f"mean |attribution| of {target}"],
        verdict=run_verdict(summary),
        num_states=summary.num_states,
        label_colours=inputs.unit_colours,
        target_label=target,
    )


def heatmap_picture(summary: RunSummary, labels: Sequence[str], history: Sequence[Mapping[str, Any]]) -> Any:
    """The ``heatmap`` of ``history`` (runs with ``global_step`` and ``mean_abs``; a :class:`~.bars.Chart`)."""
    noun, name = _words(summary, PictureInputs())[:2]
    return heatmap_chart(
        list(labels),
        [entry["global_step"] for entry in history],
        np.asarray([entry["mean_abs"] for entry in history]),
        title=[
            f"{noun.capitalize()}{name}: share of mean |attribution| by run",
            f"{noun.capitalize()}{name}: share of mean |attr| by run",
            f"{noun.capitalize()}{name}: share",
        ],
    )


def shares_picture(
    summary: RunSummary, labels: Sequence[str], history: Sequence[Mapping[str, Any]], inputs: PictureInputs
) -> np.ndarray:
    """The ``shares`` chart: the units' shares of the mean ``|attr|``, stacked per run."""
    noun, name = _words(summary, inputs)[:2]
    return shares_chart(
        list(labels),
        [entry["global_step"] for entry in history],
        np.asarray([entry["mean_abs"] for entry in history]),
        title=[
            f"Share of |attribution| by {noun[:-1]}{name}, over training",
            f"Share of |attribution| by {noun[:-1]}{name}",
            f"Shares of |attribution|{name}",
        ],
        colours=inputs.unit_colours,
    ).pixels


def _per_state(values: np.ndarray, rows_per_state: int) -> np.ndarray:
    """Rows -> one value per state: the mean over a state's action rows (``Q`` averaged: ``V(s)``)."""
    return values if rows_per_state == 1 else state_rows(values, rows_per_state).mean(axis=1)


def saliency_grid_picture(
    host: HostResult, inputs: PictureInputs, summary: RunSummary, previous_scale: float | None = None
) -> tuple[np.ndarray, float]:
    """The ``saliency`` grid of a run with spatial states, and its colour scale.

    The states drawn are ``inputs.picked``; for ``target="each"`` each state's attributions are the mean over its
    actions (IG is linear in the target: the attributions of the mean Q, ``V(s)`` of a dueling network).
    """
    if inputs.states is None or inputs.picked is None:
        raise ValueError("the saliency grid needs the held-out states and the states picked (PictureInputs)")
    rows = summary.settings.target.rows_per_state
    picked = np.asarray(inputs.picked, dtype=np.intp)
    samples = host.sample_attributions
    if rows > 1:
        samples = state_rows(samples, rows).mean(axis=1)
    f_input = _per_state(host.f_input, rows)
    f_baseline = _per_state(host.f_baseline, rows)
    target = "V(s)" if rows > 1 else summary.settings.target.words
    grid = saliency_grid(
        np.asarray(inputs.states)[picked],
        samples[picked],
        channel=inputs.channel,
        channel_names=inputs.channel_names,
        channel_colours=inputs.channel_colours,
        target_label=target,
        baseline_label=inputs.baseline,
        f_input=f_input[picked],
        f_delta=(f_input - f_baseline)[picked],
        previous_scale=previous_scale,
    )
    return grid.pixels, grid.scale


def mean_abs_map_picture(host: HostResult, summary: RunSummary, inputs: PictureInputs | None = None) -> np.ndarray:
    """The ``saliency/mean_abs`` map: mean ``|attr|`` per pixel, a tile per channel on its own scale.

    With ``inputs.presence`` (the zero baseline) each pixel is averaged over the states where its channel is
    present: the attribution of a feature equal to its baseline is exactly 0 (``attr = (x - b) * ...``), so the
    mean over those states is the mean over all states divided by the fraction present.
    """
    inputs = inputs or PictureInputs()
    mean_abs = host.features.mean_abs.reshape(host.feature_shape)
    channel_names = inputs.channel_names
    if channel_names is None and host.groups is not None:
        channel_names = host.groups.channel_names()
    presence = inputs.presence
    if presence is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_abs = np.where(presence > 0, mean_abs / np.where(presence > 0, presence, 1.0), np.nan)
    return mean_abs_map(
        mean_abs,
        host.num_states // summary.settings.target.rows_per_state,
        channel_names,
        presence=presence,
        channel_colours=inputs.channel_colours,
    ).pixels


def actions_picture(summary: RunSummary, labels: Sequence[str], inputs: PictureInputs) -> np.ndarray | None:
    """Why this action: per action (``target="each"``), or the greedy action against the runner-up (``"contrast"``).

    Returns ``None`` when the run has nothing to draw (no action numbers, no per-state values).
    """
    names = summary.settings.target.actions or ()
    top = min(summary.settings.top_k, 6)
    if summary.actions is not None:
        actions = summary.actions
        return action_attributions_chart(
            list(labels),
            actions.names,
            actions.advantage_moments,
            top_k=top,
            greedy_counts=actions.greedy_counts.tolist(),
            num_states=actions.num_states,
            target_label="A(s, a)",
            title=[
                f"What favours each action, step {summary.step:,}",
                "What favours each action",
            ],
            label_colours=inputs.unit_colours,
            note=["A(s, a) = Q(s, a) − the mean Q over the actions", "A(s, a) = Q(s, a) − mean Q"],
        ).pixels
    values = summary.units.values
    if inputs.pairs is None or values is None or not names:
        return None
    numbers = contrast_numbers(inputs.pairs(), values)
    greedy, runner_up = numbers.pair
    return contrast_chart(
        list(labels),
        numbers.moments,
        greedy=names[greedy],
        runner_up=names[runner_up],
        num_states=numbers.count,
        of_states=summary.num_states,
        top_k=top,
        label_colours=inputs.unit_colours,
    ).pixels

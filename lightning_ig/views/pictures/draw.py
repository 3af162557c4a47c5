"""The pictures a run draws, from its summary, its host result, the history and what the callback decided per fit.

The kinds, their tags and their order: :data:`~lightning_ig.views.tags.PICTURE_TAGS`; each is drawn by a
``*_picture`` function here. Which ones a run draws is :func:`~lightning_ig.views.loggers.outputs.pictures_due`'s
decision; this module is reached only when one is due. Every picture names the target once, in the target's own words
(:attr:`~lightning_ig.attribution.targets.Target.words`): a ``target="each"`` run's are ``Q(s, a)`` throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.run.actions import contrast_numbers, state_rows
from lightning_ig.run.host_result import HostResult, Moments
from lightning_ig.run.summary import RunSummary
from lightning_ig.views.pictures.cards import (
    action_panels,
    contrast_chart,
    earlier_states,
    run_state,
    shares_chart,
    verdict_card,
)
from lightning_ig.views.pictures.raster import card_sized, categorical_colours
from lightning_ig.views.pictures.saliency import first_distinct, saliency_grid
from lightning_ig.views.text import accuracy_line, trust_line

__all__ = [
    "PictureInputs",
    "actions_picture",
    "baseline_words",
    "draw",
    "picture_inputs",
    "saliency_grid_picture",
    "shares_picture",
    "verdict_picture",
]


@dataclass(frozen=True)
class PictureInputs:
    """What the pictures need besides a run, decided once per fit.

    Attributes:
        states: ``(B, *feature_shape)`` the held-out states for the saliency grid (spatial states), or ``None``.
        picked: the indices of the states the saliency grid draws (distinct ones: random play repeats frames).
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
    channel: int | None = None
    channel_names: list[str] | None = None
    channel_colours: list[str] | None = None
    unit_colours: list[str] | None = None
    baseline: str = "the baseline"
    pairs: Callable[[], np.ndarray] | None = None


def baseline_words(baseline: str, spatial: bool) -> str:
    """The baseline in words: ``the all-zero frame``, ``the mean state``, ``the baseline``."""
    thing = "frame" if spatial else "state"
    return {"zeros": f"the all-zero {thing}", "mean": f"the mean {thing}"}.get(baseline, "the baseline")


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
        saliency_states: how many states the saliency grid draws (distinct ones, the first of each); 0 for no grid.
        channel: the one channel the grid draws, or ``None``.
        channel_names: one name per channel (the groups' when they are the channels), or ``None``.
        groups_are_channels: the groups are exactly the channels: the bars get the channels' colours.
        baseline: the baseline option (``"zeros"``, ``"mean"``, or a tensor's label).
        spatial: the states are frames (``(C, H, W)`` or ``(H, W)``).
        pairs: ``(B, 2)`` each state's greedy and runner-up actions, for ``target="contrast"``; ``None`` otherwise.
    """
    array = np.asarray(states, dtype=np.float32)
    colours = categorical_colours(array.shape[1]) if spatial and array.ndim == 4 else None
    return PictureInputs(
        states=array if spatial else None,
        picked=first_distinct(array, saliency_states) if spatial and saliency_states > 0 else None,
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
    """The pictures ``due`` (``{kind: bool}``), each as high as Time Series' image box (shown at 1.0x there).

    Args:
        due: which kinds to draw.
        summary: the run.
        labels: the labels of the run's units (features or groups), as the tags show them.
        host: the run's host result (the saliency grid needs it), or ``None``.
        history: the runs so far, this one last (the shares over training, the earlier runs' verdicts).
        inputs: what the callback decided once per fit.
        previous_scale: the last saliency grid's colour scale (a change is pointed out), or ``None``.

    Returns:
        ``{kind: (H, W, 3) uint8}`` and the saliency grid's colour scale (``None`` when no grid was drawn).
    """
    pictures: dict[str, np.ndarray] = {}
    if due.get("verdict"):
        pictures["verdict"] = verdict_picture(summary, labels, history, inputs)
    if due.get("shares") and history:
        pictures["shares"] = shares_picture(summary, labels, history, inputs)
    scale = None
    if host is not None and inputs.states is not None and inputs.picked is not None and due.get("saliency"):
        pictures["saliency"], scale = saliency_grid_picture(host, inputs, summary, previous_scale)
    if due.get("actions") and (drawn := actions_picture(summary, labels, inputs)) is not None:
        pictures["actions"] = drawn
    return {kind: card_sized(pixels) for kind, pixels in pictures.items()}, scale


def _states(summary: RunSummary) -> str:
    rows = summary.settings.target.rows_per_state
    return f"{summary.num_states // rows} states × {rows} actions" if rows > 1 else f"{summary.num_states} states"


def verdict_picture(
    summary: RunSummary, labels: Sequence[str], history: Sequence[Mapping[str, Any]], inputs: PictureInputs
) -> np.ndarray:
    """The ``verdict`` card of this run (the earlier runs of ``history`` counted: its last entry is this run's)."""
    name = "" if summary.settings.name is None else f" '{summary.settings.name}'"
    target, trust = summary.settings.target.words, summary.trust_checks
    return verdict_card(
        list(labels),
        *summary.units.parts,
        title=[
            f"IG{name} at step {summary.step:,}: {target}, {_states(summary)}",
            f"Step {summary.step:,}: {target}, {_states(summary)}",
            f"Step {summary.step:,}: {target}",
        ],
        accuracy=accuracy_line(summary),
        trust=None if trust is None else (str(trust.status), trust_line(trust)),
        earlier=earlier_states(history[:-1] if history and history[-1]["global_step"] == summary.step else history),
        target=target,
        baseline=inputs.baseline,
        noun=summary.units.kind,
        label_colours=inputs.unit_colours,
    ).pixels


def shares_picture(
    summary: RunSummary, labels: Sequence[str], history: Sequence[Mapping[str, Any]], inputs: PictureInputs
) -> np.ndarray:
    """The ``shares`` chart: each unit's share of the mass per run (``mass``, or ``mean_abs`` in older entries)."""
    name = "" if summary.settings.name is None else f" '{summary.settings.name}'"
    target = summary.settings.target.words
    return shares_chart(
        list(labels),
        [entry["global_step"] for entry in history],
        [entry["mass"] if "mass" in entry else entry["mean_abs"] for entry in history],  # rows read: one a column
        title=[
            f"What {target} relies on over training{name}",
            f"{target} relies on, over training{name}",
            "Over training",
        ],
        states=[run_state(entry.get("verdict"), entry.get("trust")) for entry in history],
        colours=inputs.unit_colours,
    ).pixels


def saliency_grid_picture(
    host: HostResult, inputs: PictureInputs, summary: RunSummary, previous_scale: float | None = None
) -> tuple[np.ndarray, float]:
    """The ``saliency`` grid and its colour scale. For ``target="each"`` a state's attributions are the mean over
    its actions (IG is linear in the target: the attributions of the mean Q, which the legend says)."""
    rows, picked = summary.settings.target.rows_per_state, np.asarray(inputs.picked, dtype=np.intp)
    samples, f_input, f_baseline = host.sample_attributions, host.f_input, host.f_baseline
    if rows > 1:  # (B * A, ...) state-major -> per state, the mean over its actions
        samples = state_rows(samples, rows).mean(axis=1)
        f_input, f_baseline = state_rows(f_input, rows).mean(axis=1), state_rows(f_baseline, rows).mean(axis=1)
    target = summary.settings.target.words
    grid = saliency_grid(
        np.asarray(inputs.states)[picked],
        samples[picked],
        channel=inputs.channel,
        channel_names=inputs.channel_names,
        channel_colours=inputs.channel_colours,
        target_label=f"{target} (mean over a)" if rows > 1 else target,
        baseline_label=inputs.baseline,
        f_input=f_input[picked],
        f_delta=(f_input - f_baseline)[picked],
        previous_scale=previous_scale,
    )
    return grid.pixels, grid.scale


def _parts(moments: Moments) -> tuple[np.ndarray, np.ndarray]:
    mean_abs, mean_signed = np.nan_to_num(moments.mean_abs), np.nan_to_num(moments.mean_signed)
    positive = np.clip((mean_abs + mean_signed) / 2, 0.0, None)
    return positive, np.clip(mean_abs - positive, 0.0, None)


def actions_picture(summary: RunSummary, labels: Sequence[str], inputs: PictureInputs) -> np.ndarray | None:
    """Why this action: per action (``target="each"``), or the greedy action against the runner-up (``"contrast"``);
    ``None`` when the run has nothing to draw."""
    top = min(summary.settings.top_k, 6)
    if (actions := summary.actions) is not None:
        return action_panels(
            list(labels),
            actions.names,
            [_parts(moments) for moments in actions.advantage_moments],
            greedy_counts=actions.greedy_counts.tolist(),
            num_states=actions.num_states,
            title=[f"What favours each action, step {summary.step:,}", "What favours each action"],
            top_k=top,
            label_colours=inputs.unit_colours,
            note=["bars: A(s, a) = Q(s, a) − the mean Q over the actions", "A(s, a) = Q(s, a) − mean Q"],
        ).pixels
    names, values = summary.settings.target.actions or (), summary.units.values
    if inputs.pairs is None or values is None or not names:
        return None
    numbers = contrast_numbers(inputs.pairs(), values)
    greedy, runner_up = numbers.pair
    return contrast_chart(
        list(labels),
        *_parts(numbers.moments),
        greedy=names[greedy],
        runner_up=names[runner_up],
        num_states=numbers.count,
        of_states=summary.num_states,
        top_k=top,
        label_colours=inputs.unit_colours,
    ).pixels

"""Why this action: pictures of per-action attributions (``target="each"``) and of the greedy action against the
runner-up (``target="contrast"``); their numbers are :mod:`lightning_ig.run.actions`'.

The pictures follow the bar chart of :mod:`~lightning_ig.views.pictures.bars` (the same two-tone bars, sizes and
legend):

* :func:`action_attributions_chart`: small multiples, one panel per action, the same units in the same
  rows and one value scale across the panels, so that "left relies on the ball more than right does" is
  a comparison of two bar lengths;
* :func:`contrast_chart`: the bar chart of ``Q(greedy) - Q(runner-up)``, titled "why <greedy> rather than
  <runner-up>", blue for what favours the greedy action and red for what favours the runner-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_ig.run.host_result import Moments
from lightning_ig.run.statistics import rank_order
from lightning_ig.views.pictures.bars import Chart, bar_chart, label_swatch, sign_legend, sign_parts, two_tone_bar
from lightning_ig.views.pictures.raster import CARD_WIDTH, SMALL_SIZE, TEXT_SIZE, Canvas
from lightning_ig.views.text import format_value

__all__ = ["action_attributions_chart", "contrast_chart"]

_INK = "#222222"
_MUTED = "#555555"
_GRID = "#e3e3e3"
_GROUND = "#262626"
_LINE = 15
_MAX_PANELS = 6  # more actions (Atari's 18) than this: the most often greedy ones


def contrast_chart(
    labels: Sequence[str],
    moments: Moments,
    *,
    greedy: str,
    runner_up: str,
    num_states: int | None = None,
    of_states: int | None = None,
    top_k: int = 10,
    verdict: tuple[str, str] | None = None,
    label_colours: Sequence[str] | None = None,
) -> Chart:
    """The bar chart of the attributions of ``Q(s, greedy) - Q(s, runner-up)``: "why <greedy> rather than <runner-up>".

    Args:
        labels: one label per unit.
        moments: the units' moments over the states where ``greedy`` is greedy and ``runner_up`` second.
        greedy: the greedy action's name.
        runner_up: the runner-up's name.
        num_states: how many states the moments are over (whiskers; the title says so).
        of_states: how many held-out states there are in all (the title says "in 41 of 64 states").
        top_k: how many bars (default 10).
        verdict: the completeness verdict of the contrast, as
            :func:`~lightning_ig.views.pictures.bars.top_features_chart` takes it.
        label_colours: a swatch per unit beside its label.

    Returns:
        The :class:`~lightning_ig.views.pictures.bars.Chart`.
    """
    positive, negative = sign_parts(moments)
    where = ""
    if num_states is not None:
        where = f"{num_states} states" if of_states is None else f"{num_states} of {of_states} states"
    difference = f"Q(s, {greedy}) − Q(s, {runner_up})"
    return bar_chart(
        labels,
        positive,
        negative,
        spread=moments.stddev_abs,
        top_k=top_k,
        title=[f"Why {greedy} rather than {runner_up} ({where})", f"Why {greedy} rather than {runner_up}"]
        if where
        else [f"Why {greedy} rather than {runner_up}"],
        value_label=[
            f"mean |attribution| of {difference}, {where}",
            f"mean |attr| of {difference}, {where}",
            f"mean |attribution| of {difference}",
        ]
        if where
        else [f"mean |attribution| of {difference}"],
        verdict=verdict,
        num_states=num_states,
        label_colours=label_colours,
        legend=(f"favours {greedy}", f"favours {runner_up}"),
    )


def action_attributions_chart(
    labels: Sequence[str],
    action_names: Sequence[str],
    moments: Sequence[Moments],
    *,
    top_k: int = 6,
    greedy_counts: Sequence[int] | None = None,
    num_states: int | None = None,
    target_label: str = "Q(s, a)",
    title: str | Sequence[str] | None = None,
    label_colours: Sequence[str] | None = None,
    note: Sequence[str] | None = None,
) -> Chart:
    """Small multiples: per action, the top units' mean ``|attr|`` split by sign, on one scale for all actions.

    Args:
        labels: one label per unit.
        action_names: one name per action.
        moments: one :class:`~lightning_ig.run.host_result.Moments` per action (over the held-out states).
        top_k: how many units (rows; default 6): those with the largest mean ``|attr|`` in any action.
        greedy_counts: per action, in how many states it is greedy (written under its name).
        num_states: how many states the moments are over (the footer says so).
        target_label: what is attributed per action (default ``"Q(s, a)"``; ``"A(s, a)"`` for the
            advantages, :attr:`~lightning_ig.run.actions.ActionSummary.advantage_moments`).
        title: the title (default "What each action's <target> relies on").
        label_colours: a swatch per unit beside its label.
        note: a line under the footer, the first of these that fits (e.g. what ``target_label`` means); ``None``:
            none.

    Returns:
        The :class:`~lightning_ig.views.pictures.bars.Chart` (:data:`~lightning_ig.views.pictures.raster.CARD_WIDTH`
        wide).

    Raises:
        ValueError: counts of names, moments, labels or colours that do not match.
    """
    actions = len(action_names)
    if len(moments) != actions or actions == 0:
        raise ValueError(f"got {len(moments)} moments for {actions} actions; give one Moments per action")
    if greedy_counts is not None and len(greedy_counts) != actions:
        raise ValueError(f"greedy_counts has {len(greedy_counts)} counts for {actions} actions; give one per action")
    parts = [sign_parts(m) for m in moments]  # per action (positive (U,), negative (U,))
    units = len(parts[0][0])
    if len(labels) != units or (label_colours is not None and len(label_colours) != units):
        raise ValueError(f"got {len(labels)} labels for {units} units; give one label (and colour) per unit")
    shown_actions = _panels(actions, greedy_counts)
    totals = np.stack([parts[a][0] + parts[a][1] for a in shown_actions])  # (A', U)
    order = rank_order(totals.max(axis=0))[:top_k]
    limit = float(totals[:, order].max()) if order.size and totals[:, order].max() > 0 else 1.0
    row, top = 22, 2 * _LINE + 4 + 2 * _LINE
    canvas = Canvas(CARD_WIDTH, top + row * len(order) + _LINE * (2 if note else 1) + 8)
    headings = [f"What each action's {target_label} relies on", f"Per action: {target_label}"]
    if title:
        headings = [title] if isinstance(title, str) else list(title)
    canvas.text(
        (3, 2), canvas.first_fitting(headings, CARD_WIDTH - 6, size=TEXT_SIZE, bold=True), size=TEXT_SIZE, bold=True
    )
    raises = canvas.first_fitting([f"raises {target_label}", "raises it"], CARD_WIDTH / 2 - 24, size=SMALL_SIZE)
    sign_legend(canvas, _LINE + 4, (raises, "lowers it"))
    swatch = 12 if label_colours is not None else 0
    shown = [canvas.fit(str(labels[i]), int(CARD_WIDTH * 0.4) - swatch, size=TEXT_SIZE) for i in order]
    left = 8 + swatch + int(max((canvas.text_width(s, size=TEXT_SIZE) for s in shown), default=20.0))
    width = (CARD_WIDTH - 4 - left) / len(shown_actions)
    for index, unit in enumerate(order):
        centre = top + row * index + row / 2
        if label_colours is not None:
            label_swatch(canvas, left - swatch - 4, centre, label_colours[unit])
        canvas.text((left - 6 - swatch, centre), shown[index], size=TEXT_SIZE, anchor="rm")
    for panel, action in enumerate(shown_actions):
        x0 = left + panel * width + 3
        span = width - 8
        name = canvas.fit(str(action_names[action]), width - 4, size=TEXT_SIZE, bold=True)
        canvas.text((x0, 2 * _LINE + 4), name, size=TEXT_SIZE, bold=True)
        if greedy_counts is not None:
            words = [f"greedy {greedy_counts[action]}/{num_states}"] if num_states else []
            fallbacks = [f"greedy in {greedy_counts[action]}", f"greedy {greedy_counts[action]}×"]
            count = canvas.first_fitting([*words, *fallbacks], width - 4, size=SMALL_SIZE)
            canvas.text((x0, 3 * _LINE + 4), count, size=SMALL_SIZE, colour=_MUTED)
        canvas.line([(x0, top - 2), (x0, top + row * len(order))], _INK)
        canvas.line([(x0 + span, top - 2), (x0 + span, top + row * len(order))], _GRID)
        positive, negative = parts[action]
        for index, unit in enumerate(order):
            blue = x0 + span * float(positive[unit]) / limit
            red = blue + span * float(negative[unit]) / limit
            two_tone_bar(canvas, x0, blue, red, centre=top + row * index + row / 2, half=0.34 * row)
    over = f" over {num_states} states" if num_states is not None else ""
    footer = canvas.first_fitting(
        [
            f"mean |attribution|{over}; each panel 0 to {format_value(limit)}",
            f"mean |attr|{over}; panels 0 to {format_value(limit)}",
        ],
        CARD_WIDTH - 6,
        size=SMALL_SIZE,
    )
    canvas.text((3, top + row * len(order) + 4), footer, size=SMALL_SIZE, colour=_MUTED)
    if note:
        line = canvas.first_fitting(list(note), CARD_WIDTH - 6, size=SMALL_SIZE)
        canvas.text((3, top + row * len(order) + 4 + _LINE), line, size=SMALL_SIZE, colour=_MUTED)
    return Chart(canvas.pixels, tuple(shown), limit)


def _panels(actions: int, greedy_counts: Sequence[int] | None) -> list[int]:
    """The actions drawn, in their order: all of them, or the six most often greedy (ties: the lower index)."""
    if actions <= _MAX_PANELS:
        return list(range(actions))
    counts = np.asarray(greedy_counts if greedy_counts is not None else np.zeros(actions))
    return sorted(np.argsort(-counts, kind="stable")[:_MAX_PANELS].tolist())

"""The charts of a run, each drawn at the size TensorBoard's Time Series shows it (320 x 215 px, 1.0x).

* :func:`verdict_card`: the first card under ``ig/``: the accuracy verdict and the trust status (large, in their
  colours, never a smoothed line), how many earlier runs failed, and what the target relies on: each unit's share of
  the attribution mass, split into the part that raises the target (blue) and the part that lowers it (red);
* :func:`shares_chart`: each unit's share of the mass over training, stacked, under a strip of every run's verdict;
* :func:`action_panels` (``target="each"``): per action, the same rows on one scale; :func:`contrast_chart`
  (``target="contrast"``): what favours the greedy action over the runner-up.

A unit's mass is the mean over the states of its features' ``|attr|``, each feature's positive and negative part
counted apart (:attr:`lightning_ig.run.summary.Units.parts`), so a group whose cells cancel shows both colours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.run.statistics import rank_order
from lightning_ig.views.pictures.raster import (
    CARD_HEIGHT,
    CARD_WIDTH,
    NEGATIVE,
    POSITIVE,
    SMALL_SIZE,
    TEXT_SIZE,
    TITLE_SIZE,
    Canvas,
    categorical_colours,
    rgb,
)
from lightning_ig.views.text import HEADLINES, format_percent, format_value

__all__ = [
    "GROUND",
    "INK",
    "LINE",
    "MUTED",
    "STATE_COLOURS",
    "Chart",
    "action_panels",
    "contrast_chart",
    "earlier_states",
    "format_step",
    "run_state",
    "shares_chart",
    "verdict_card",
]

INK, MUTED, GRID, GROUND = "#222222", "#555555", "#e3e3e3", "#262626"
LINE = 15
STATE_COLOURS = {"pass": "#1b7837", "fail": "#b2182b", "unresolved": "#8c510a", "unknown": "#9a9a9a"}
"""A run's state in every picture: green passed, red failed, brown unresolved or not checked, grey not recorded."""
_MARKS = {"pass": "✓", "fail": "✗", "unresolved": "?", "unknown": "?"}
_MOST_ROWS = 5
_ROW = 16
_MAX_BANDS = 7  # the shares chart: the largest units of the last run, the rest summed into "other"
_MAX_PANELS = 6  # the action panels: more actions (Atari's 18) than this, the most often greedy


@dataclass(frozen=True)
class Chart:
    """A drawn chart: ``pixels (H, W, 3)`` uint8 and the unit labels drawn, in order."""

    pixels: np.ndarray
    labels: tuple[str, ...]


def run_state(verdict: str | None, trust: str | None) -> str:
    """One run's state from its accuracy verdict and trust status: ``"fail"`` if either failed (NaN/Inf included),
    ``"unresolved"`` if either could not decide, ``"pass"`` if they passed, ``"unknown"`` where none was recorded."""
    if verdict is None:
        return "unknown"
    if verdict in ("fail", "non-finite") or trust == "failed":
        return "fail"
    return "unresolved" if verdict == "unchecked" or trust == "unresolved" else "pass"


def _title(canvas: Canvas, wordings: Sequence[str], y: float = 2) -> None:
    text = canvas.first_fitting(list(wordings), CARD_WIDTH - 6, size=TEXT_SIZE, bold=True)
    canvas.text((3, y), text, size=TEXT_SIZE, bold=True)


def _line(canvas: Canvas, y: float, wordings: Sequence[str], colour: str = MUTED, size: int = SMALL_SIZE) -> None:
    canvas.text((3, y), canvas.first_fitting(list(wordings), CARD_WIDTH - 6, size=size), size=size, colour=colour)


def _label_swatch(canvas: Canvas, left: float, centre: float, colour: str) -> None:
    """A unit's colour (its channel's, in the frames) as a small square on the frames' dark ground."""
    canvas.rectangle((left, centre - 4, left + 8, centre + 4), GROUND)
    canvas.rectangle((left + 2, centre - 2, left + 6, centre + 2), rgb(colour))


def _two_tone_bar(canvas: Canvas, left: float, blue_end: float, red_end: float, *, centre: float, half: float) -> None:
    """A bar from ``left``: blue up to ``blue_end``, red on to ``red_end``, on whole pixels."""
    start, middle, end = round(left), round(blue_end), round(red_end)
    top, bottom = round(centre - half), round(centre + half)
    if middle > start:
        canvas.rectangle((start, top, middle - 1, bottom), POSITIVE)
    if end > middle:
        canvas.rectangle((middle, top, end - 1, bottom), NEGATIVE)


def _sign_legend(canvas: Canvas, y: float, wordings: Sequence[tuple[str, str]]) -> None:
    """The blue and the red swatch with what they mean, the first wording that fits one line."""
    for raises, lowers in wordings:
        width = 60 + canvas.text_width(raises, size=SMALL_SIZE) + canvas.text_width(lowers, size=SMALL_SIZE)
        if width <= CARD_WIDTH or (raises, lowers) == wordings[-1]:
            break
    x = 3.0
    for colour, meaning in ((POSITIVE, raises), (NEGATIVE, lowers)):
        canvas.rectangle((x, y + 4, x + 14, y + 11), colour)
        words = canvas.fit(meaning, CARD_WIDTH - x - 24, size=SMALL_SIZE)
        canvas.text((x + 18, y + 8), words, size=SMALL_SIZE, anchor="lm")
        x += 30 + canvas.text_width(words, size=SMALL_SIZE)


def _bar_rows(
    canvas: Canvas,
    labels: Sequence[str],
    positive: np.ndarray,
    negative: np.ndarray,
    order: Sequence[int] | np.ndarray,
    *,
    top: float,
    row: int,
    ends: Sequence[str],
    colours: Sequence[str] | None,
) -> None:
    """One row per unit of ``order``: its swatch and label, a two-tone bar (the largest fills the row), ``ends``."""
    swatch = 12 if colours is not None else 0
    shown = [canvas.fit(str(labels[i]), CARD_WIDTH * 0.45 - swatch, size=TEXT_SIZE) for i in order]
    left = 11 + swatch + max(canvas.text_width(text, size=TEXT_SIZE) for text in shown)
    right = CARD_WIDTH - 8 - max(canvas.text_width(text, size=SMALL_SIZE) for text in ends)
    totals = positive + negative
    largest = float(max(totals[i] for i in order)) or 1.0
    for index, unit in enumerate(order):
        centre = top + row * index + row / 2
        if colours is not None:
            _label_swatch(canvas, left - swatch - 4, centre, colours[unit])
        canvas.text((left - 8 - swatch, centre), shown[index], size=TEXT_SIZE, anchor="rm")
        scale = (right - 4 - left) / largest
        blue, red = left + scale * float(positive[unit]), left + scale * float(totals[unit])
        _two_tone_bar(canvas, left, blue, red, centre=centre, half=0.33 * row)
        canvas.text((red + 4, centre), ends[index], size=SMALL_SIZE, anchor="lm")


def _mass(positive: np.ndarray, negative: np.ndarray, labels: Sequence[str], colours: Sequence[str] | None) -> tuple:
    positive = np.nan_to_num(np.asarray(positive, dtype=np.float64), posinf=0.0)
    negative = np.nan_to_num(np.asarray(negative, dtype=np.float64), posinf=0.0)
    if not len(labels) == len(positive) == len(negative) or (colours is not None and len(colours) != len(labels)):
        raise ValueError(
            f"got {len(labels)} labels, {len(positive)} positive and {len(negative)} negative parts"
            + ("" if colours is None else f" and {len(colours)} colours")
            + "; give one of each per unit"
        )
    return np.clip(positive, 0.0, None), np.clip(negative, 0.0, None)


def verdict_card(
    labels: Sequence[str],
    positive: np.ndarray,
    negative: np.ndarray,
    *,
    title: Sequence[str],
    accuracy: tuple[str, str],
    trust: tuple[str, str] | None = None,
    earlier: Sequence[tuple[int, str]] = (),
    target: str = "the target",
    baseline: str = "the baseline",
    noun: str = "features",
    label_colours: Sequence[str] | None = None,
) -> Chart:
    """The verdict and what the target relies on, in one card.

    Args:
        labels: one label per unit (feature or group).
        positive, negative: ``(U,)`` each unit's positive and negative attribution mass (magnitudes).
        title: wordings of the title, the longest first (the first that fits is drawn).
        accuracy: ``(kind, line)``: ``"pass"``, ``"fail"``, ``"non-finite"`` or ``"unchecked"``, and its numbers.
        trust: ``(status, line)``: ``"passed"``, ``"failed"`` or ``"unresolved"`` and why; ``None``: no checks.
        earlier: ``(global step, state)`` of the earlier runs (:func:`run_state`), for the line that counts failures.
        target: what is attributed (``"V(s)"``).
        baseline: what the attributions are relative to (``"the all-zero frame"``).
        noun: ``"features"`` or ``"groups"``.
        label_colours: one ``"#rrggbb"`` per unit, drawn beside its label.

    Returns:
        The :class:`Chart` (:data:`~lightning_ig.views.pictures.raster.CARD_WIDTH` wide).

    Raises:
        ValueError: labels, parts or colours of different lengths.
    """
    positive, negative = _mass(positive, negative, labels, label_colours)
    totals = positive + negative
    whole = float(totals.sum())
    share = totals / whole if whole > 0 else np.zeros_like(totals)
    rest = len(totals) > _MOST_ROWS
    order = rank_order(totals)[: _MOST_ROWS - 1 if rest else _MOST_ROWS]
    canvas = Canvas(CARD_WIDTH, CARD_HEIGHT)
    _title(canvas, title)
    kind, detail = accuracy
    state = {"pass": "pass", "unchecked": "unresolved"}.get(kind, "fail")
    headline = HEADLINES.get(kind, HEADLINES["unchecked"])
    canvas.text((3, 18), headline, size=TITLE_SIZE, bold=True, colour=STATE_COLOURS[state])
    _line(canvas, 36, [detail, detail.replace(" completeness error", " error")], STATE_COLOURS[state])  # bar kept
    y = 51
    if trust is not None:
        status, why = trust
        trust_state = {"passed": "pass", "failed": "fail"}.get(status, "unresolved")
        words = f"{_MARKS[trust_state]} trust checks {status}"
        canvas.text((3, y), words, size=TEXT_SIZE, bold=True, colour=STATE_COLOURS[trust_state])
        x = 10 + canvas.text_width(words, size=TEXT_SIZE, bold=True)
        if canvas.text_width(why, size=SMALL_SIZE) > CARD_WIDTH - x - 3:  # its own line, not cut: the card has room
            x, y = 14, y + LINE
        canvas.text((x, y + 1), canvas.fit(why, CARD_WIDTH - x - 3, size=SMALL_SIZE), size=SMALL_SIZE, colour=MUTED)
        y += LINE + 1
    failed = [step for step, state in earlier if state == "fail"]
    if earlier:
        runs = f"{len(earlier):,} earlier run{'s' * (len(earlier) > 1)}"
        if failed:
            counted = f"✗ failed at {len(failed):,} of {runs}"
            last = [f"{counted}, the last at step {failed[-1]:,}", f"{counted}, last at {format_step(failed[-1])}"]
            _line(canvas, y, [*last, counted], STATE_COLOURS["fail"])
        else:
            _line(canvas, y, [f"no failure in the {runs}", f"no failure in {runs.replace(' earlier', '')}"])
        y += LINE
    _line(
        canvas, y + 2, [f"What {target} relies on: share of |attribution|", f"What {target} relies on"], INK, TEXT_SIZE
    )
    top, percents = y + LINE + 4, [format_percent(float(share[i]), 2) for i in order]
    _bar_rows(canvas, labels, positive, negative, order, top=top, row=_ROW, ends=percents, colours=label_colours)
    y = top + _ROW * len(order)
    if rest:
        others = len(totals) - len(order)
        rest_share = max(1.0 - float(share[order].sum()), 0.0) if whole > 0 else 0.0
        _line(canvas, y + 1, [f"the other {others} {noun}: {format_percent(rest_share)}"])
        y += LINE
    raises = f"raises {target}"
    _sign_legend(canvas, y + 1, [(raises, f"lowers it, vs {baseline}"), (raises, "lowers it"), ("raises", "lowers")])
    return Chart(canvas.pixels, tuple(str(labels[i]) for i in order))


def format_step(step: int) -> str:
    """A global step as a tick label: ``250``, ``3,437``, ``24k``, ``1.2M`` (at most five characters past 9,999)."""
    step = int(step)
    if abs(step) < 10_000:
        return f"{step:,}"
    if abs(step) < 999_500:  # 999,500 rounds to "1000k": 1M
        return f"{format_value(step / 1000, 3)}k"
    return f"{format_value(step / 1e6, 3)}M" if abs(step) < 999_500_000 else f"{format_value(step / 1e9, 3)}G"


def _step_axis(canvas: Canvas, left: int, right: int, bottom: int, steps: Sequence[int]) -> None:
    """Tick labels under the runs: the first, the last, and between them those that do not overlap."""
    runs = len(steps)
    candidates = np.unique(np.linspace(0, runs - 1, num=max(1, min(runs, 5))).round().astype(int))
    placed: list[tuple[float, float]] = []
    for tick in [int(candidates[0]), int(candidates[-1]), *candidates[1:-1]]:  # the ends first: they always show
        x, text = left + (right - left) * (tick + 0.5) / runs, format_step(steps[tick])
        width = canvas.text_width(text, size=SMALL_SIZE)
        start = min(max(x - width / 2, left - 4), right + 4 - width)
        if any(start < end + 6 and start + width + 6 > begin for begin, end in placed):
            continue
        placed.append((start, start + width))
        canvas.line([(x, bottom), (x, bottom + 3)], INK)
        canvas.text((start, bottom + 4), text, size=SMALL_SIZE)
    canvas.text(((left + right) / 2, bottom + 4 + LINE), "global step", size=SMALL_SIZE, anchor="ma", colour=MUTED)


def shares_chart(
    labels: Sequence[str],
    steps: Sequence[int],
    mass: np.ndarray | Sequence[Sequence[float]],
    *,
    title: Sequence[str],
    states: Sequence[str] | None = None,
    colours: Sequence[str] | None = None,
) -> Chart:
    """Each unit's share of the run's attribution mass, stacked, one column per IG run, under the runs' verdicts.

    The seven largest units of the last run get a band each (the rest one grey "other" band), labelled at the right
    with their last share; runs are bars while there are few of them, an area when many.

    Args:
        labels: one label per unit.
        steps: the global step of each run.
        mass: ``(runs, U)`` each run's mass per unit (negative values and NaN count as 0); only the last run and one
            run a pixel column are read (the history's rows as they are: a long fit's are not all converted).
        title: wordings of the title, the longest first.
        states: each run's state (:func:`run_state`), drawn as a strip over the columns; ``None``: no strip.
        colours: one ``"#rrggbb"`` per unit (default: the frames' channel colours).

    Raises:
        ValueError: labels, colours, steps or states that do not match ``mass``.
    """
    runs, last = len(mass), _shares(mass[len(mass) - 1 :])  # the last run's: the bands' order and labels
    units = last.shape[1]
    if len(labels) != units or (colours is not None and len(colours) != units) or len(steps) != runs:
        raise ValueError(f"got {len(labels)} labels and {len(steps)} steps for {runs} runs of {units} units")
    if states is not None and len(states) != runs:
        raise ValueError(f"got {len(states)} run states for {runs} runs")
    palette = list(colours) if colours is not None else categorical_colours(units)
    order = rank_order(last[0])
    keep, rest = order[:_MAX_BANDS], order[_MAX_BANDS:]
    names, band_colours = [str(labels[i]) for i in keep], [palette[i] for i in keep]
    if rest.size:
        names, band_colours = [*names, f"other {rest.size}"], [*band_colours, "#5a5a5a"]
    canvas = Canvas(CARD_WIDTH, CARD_HEIGHT)
    _title(canvas, title)
    room = max(canvas.text_width(f"100% {name}", size=SMALL_SIZE) for name in names)
    left, right = 44, CARD_WIDTH - min(int(CARD_WIDTH * 0.46), 24 + int(room))
    top, bottom = LINE + 8 + (16 if states is not None else 0), CARD_HEIGHT - 2 * LINE - 8
    columns = np.minimum((np.arange(right - left) * runs) // (right - left), runs - 1)  # pixel column -> run
    drawn = np.unique(np.append(columns, runs - 1))  # the runs read: at most one a column, and the last
    shares = _shares([mass[i] for i in drawn])
    bands = shares[:, keep]
    if rest.size:
        bands = np.concatenate([bands, shares[:, rest].sum(axis=1, keepdims=True)], axis=1)
    if states is not None:  # every run's verdict above its column: a failure is seen whatever the step slider shows
        # each pixel column the worst state of the runs it covers: one failed run of thousands still shows
        kinds = ("unknown", "pass", "unresolved", "fail")
        severity = np.array([kinds.index(state) if state in kinds else 0 for state in states])
        table = np.array([rgb(STATE_COLOURS[kind]) for kind in kinds], np.uint8)
        canvas.paste(np.repeat(table[np.maximum.reduceat(severity, columns)][None], 7, axis=0), left, top - 14)
        canvas.text((left - 4, top - 11), "verdict", size=SMALL_SIZE - 2, anchor="rm", colour=MUTED)
    canvas.paste(_stacked(bands[np.searchsorted(drawn, columns)], band_colours, bottom - top, columns, runs), left, top)
    canvas.outline((left - 1, top - 1, right, bottom), INK)
    for value in (0.0, 0.5, 1.0):
        y = bottom - (bottom - top) * value
        canvas.line([(left - 3, y), (left - 1, y)], INK)
        canvas.text((left - 5, y), format_percent(value), size=SMALL_SIZE, anchor="rm")
    _band_labels(canvas, bands[-1], names, band_colours, left=right + 4, top=top, bottom=bottom)
    _step_axis(canvas, left, right, bottom, steps)
    return Chart(canvas.pixels, tuple(names))


def _shares(rows: Any) -> np.ndarray:
    """``(R, U)`` masses -> each run's share of its own mass (a run's shares read that run alone)."""
    values = np.clip(np.nan_to_num(np.asarray(rows, dtype=np.float64), posinf=0.0), 0.0, None)
    if values.ndim != 2 or not values.shape[0]:
        raise ValueError(f"mass must be (runs, units) with at least one run, got shape {values.shape}")
    totals = values.sum(axis=1, keepdims=True)
    return values / np.where(totals > 0, totals, 1.0)


def _stacked(bands: np.ndarray, colours: Sequence[str], height: int, column_run: np.ndarray, runs: int) -> np.ndarray:
    """``(width, K)`` the shares of each pixel column's run (``column_run``, of ``runs``) -> ``(height, width, 3)``
    pixels: per run a column stacked bottom-up, on the dark ground."""
    width, count = bands.shape
    table = np.array([rgb(GROUND), *(rgb(colour) for colour in colours)], dtype=np.uint8)
    edges = np.cumsum(bands, axis=1)  # (width, K) the top of each band, only the runs drawn
    level = (np.arange(height)[::-1] + 0.5) / height  # (height,) the share at each pixel row, bottom = 0
    band = (level[:, None, None] >= edges[None, :, :]).sum(axis=2) + 1  # (height, width) 1..K, K+1 above all bands
    index = np.where(band > count, 0, band)  # above the stack (a run of zeros): the ground
    if runs <= width // 6:  # few runs: bars, a gap of the dark ground between them (a white band stays seen)
        index[:, np.searchsorted(column_run, np.arange(1, runs))] = 0
    return table[index]


def _band_labels(
    canvas: Canvas, last: np.ndarray, names: list[str], colours: Sequence[str], *, left: int, top: int, bottom: int
) -> None:
    """Each band's name and last share beside the chart at the band's height, pushed apart so none overlap; a name
    too long for the room goes on two lines, never cut mid-word, where all of them fit so (else on one, cut)."""
    step, room = LINE - 1, CARD_WIDTH - left - 16
    labels = [f"{format_percent(float(s), 2)} {name}" for name, s in zip(names, last)]
    texts = [_wrapped(canvas, label, room) for label in labels]
    if sum(map(len, texts)) * step > bottom - top:  # two lines each would not fit beside the chart: one each, cut
        texts = [[canvas.fit(label, room, size=SMALL_SIZE)] for label in labels]
    half = [(len(lines) - 1) * step / 2 + LINE / 2 for lines in texts]
    wanted = list(bottom - (bottom - top) * (np.cumsum(last) - last / 2))  # bottom band first
    wanted[0] = min(wanted[0], bottom - half[0])  # inside the chart, and the others pushed up from there
    for index in range(1, len(wanted)):  # upwards: each label clear of the one below it
        wanted[index] = min(wanted[index], wanted[index - 1] - (len(texts[index]) + len(texts[index - 1])) * step / 2)
    wanted[-1] = max(wanted[-1], top + half[-1])
    for index in range(len(wanted) - 2, -1, -1):  # then downwards from the top: each clear of the one above it
        wanted[index] = max(wanted[index], wanted[index + 1] + (len(texts[index]) + len(texts[index + 1])) * step / 2)
    for index, (lines, colour) in enumerate(zip(texts, colours)):
        y = wanted[index] - (len(lines) - 1) * step / 2
        _label_swatch(canvas, left, y, colour)
        for line, text in enumerate(lines):
            canvas.text((left + 13, y + line * step), text, size=SMALL_SIZE, anchor="lm")


def _wrapped(canvas: Canvas, text: str, room: float) -> list[str]:
    """``text`` on one line if it fits ``room`` pixels, else on two, broken at the last space that lets the first
    fit."""
    if canvas.text_width(text, size=SMALL_SIZE) <= room:
        return [text]
    words = text.split(" ")
    for count in range(len(words) - 1, 0, -1):
        if canvas.text_width(first := " ".join(words[:count]), size=SMALL_SIZE) <= room:
            return [first, canvas.fit(" ".join(words[count:]), room, size=SMALL_SIZE)]
    return [canvas.fit(text, room, size=SMALL_SIZE)]


def contrast_chart(
    labels: Sequence[str],
    positive: np.ndarray,
    negative: np.ndarray,
    *,
    greedy: str,
    runner_up: str,
    num_states: int,
    of_states: int,
    top_k: int = 6,
    label_colours: Sequence[str] | None = None,
) -> Chart:
    """What favours ``greedy`` over ``runner_up``: the mass of the attributions of ``Q(s, greedy) - Q(s, runner-up)``
    over the states where that pair is the commonest, blue for what favours the greedy action, red the runner-up."""
    positive, negative = _mass(positive, negative, labels, label_colours)
    order = rank_order(positive + negative)[: min(top_k, 8)]
    canvas = Canvas(CARD_WIDTH, CARD_HEIGHT)
    _title(canvas, [f"Why {greedy} rather than {runner_up}", f"Why {greedy}"])
    _sign_legend(canvas, LINE + 4, [(f"favours {greedy}", f"favours {runner_up}")])
    ends = [format_value(float(positive[i] + negative[i])) for i in order]
    top = 2 * LINE + 8
    _bar_rows(canvas, labels, positive, negative, order, top=top, row=20, ends=ends, colours=label_colours)
    difference = f"Q(s, {greedy}) − Q(s, {runner_up})"
    over = f"over {num_states} of {of_states} states"  # the pair's states: the title has no room for them
    _line(
        canvas, top + 20 * len(order) + 4, [f"mean |attribution| of {difference} {over}", f"mean |attribution| {over}"]
    )
    return Chart(canvas.pixels, tuple(str(labels[i]) for i in order))


def action_panels(
    labels: Sequence[str],
    action_names: Sequence[str],
    parts: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    greedy_counts: Sequence[int],
    num_states: int,
    title: Sequence[str],
    top_k: int = 6,
    label_colours: Sequence[str] | None = None,
    note: Sequence[str] = (),
) -> Chart:
    """Small multiples: per action, the top units' mass split by sign, one scale for all the panels.

    Args:
        labels: one label per unit.
        action_names: one name per action.
        parts: per action, ``(positive, negative)`` mass per unit.
        greedy_counts: per action, in how many states it is greedy (under its name).
        num_states: how many states the numbers are over.
        title: wordings of the title, the longest first.
        top_k: how many units (rows): those with the largest mass in any action.
        label_colours: a swatch per unit beside its label.
        note: wordings of a line under the panels, the longest first.

    Raises:
        ValueError: counts of names, parts, labels or colours that do not match.
    """
    actions = len(action_names)
    if len(parts) != actions or len(greedy_counts) != actions or not actions:
        raise ValueError(f"got {len(parts)} parts and {len(greedy_counts)} counts for {actions} actions")
    parts = [_mass(p, n, labels, label_colours) for p, n in parts]
    row, top = 22, 4 * LINE + 4
    canvas = Canvas(CARD_WIDTH, CARD_HEIGHT)
    _sign_legend(canvas, LINE + 4, [("raises its Q above the mean action's", "lowers it"), ("raises", "lowers")])
    swatch = 12 if label_colours is not None else 0
    forms = [f"greedy {{}}/{num_states}", "greedy {}", "{}"]
    ranked = np.argsort(-np.asarray(greedy_counts), kind="stable").tolist()  # the most often greedy first
    fits = (CARD_HEIGHT - top - 4 - (1 + bool(note)) * LINE) // row  # rows above the scale's line and the note
    for columns in range(min(actions, _MAX_PANELS), 0, -1):  # fewer panels, down to two, where a name would be cut
        shown_actions = sorted(ranked[:columns])
        totals = np.stack([parts[a][0] + parts[a][1] for a in shown_actions])  # (A', U)
        order = rank_order(totals.max(axis=0))[: min(top_k, fits)]
        share = 0.4 if columns <= 3 else 0.27  # the labels leave the panels room for their names
        shown = [canvas.fit(str(labels[i]), CARD_WIDTH * share - swatch, size=TEXT_SIZE) for i in order]
        left = 8 + swatch + max(canvas.text_width(s, size=TEXT_SIZE) for s in shown)
        most = max(greedy_counts[action] for action in shown_actions)  # the widest count picks one wording for all
        room = (CARD_WIDTH - 4 - left) / columns - 4
        form = next((f for f in forms if canvas.text_width(f.format(most), size=SMALL_SIZE) <= room), "{}")
        bare = f"greedy in {num_states}:" if form == "{}" else ""  # the bare counts named once, in the labels' column
        left = max(left, canvas.text_width(bare, size=SMALL_SIZE) + 8)  # widened to hold the words
        width = (CARD_WIDTH - 4 - left) / columns
        names = [str(action_names[action]) for action in shown_actions]  # bold where every name fits so, else small
        if columns <= 2 or all(canvas.text_width(name, size=SMALL_SIZE) <= width - 3 for name in names):
            break
    if columns < actions:  # the card says it shows some of the actions, and which
        which = f"the {columns} of {actions} most often greedy"
        shown_of = [f"{wording}: {part}" for part in (which, f"{columns} of {actions}") for wording in title]
        title = [*shown_of, which.capitalize()]
    _title(canvas, title)
    limit = float(totals[:, order].max()) or 1.0
    canvas.text((left - 6, 3 * LINE + 4), bare, size=SMALL_SIZE, colour=MUTED, anchor="ra")
    bold = all(canvas.text_width(name, size=TEXT_SIZE, bold=True) <= width - 3 for name in names)
    for index, unit in enumerate(order):
        centre = top + row * index + row / 2
        if label_colours is not None:
            _label_swatch(canvas, left - swatch - 4, centre, label_colours[unit])
        canvas.text((left - 6 - swatch, centre), shown[index], size=TEXT_SIZE, anchor="rm")
    for panel, action in enumerate(shown_actions):
        x0, span = left + panel * width + 3, width - 8
        size = TEXT_SIZE if bold else SMALL_SIZE
        canvas.text((x0, 2 * LINE + 4), canvas.fit(names[panel], width - 3, size=size, bold=bold), size=size, bold=bold)
        count = form.format(greedy_counts[action])
        canvas.text((x0, 3 * LINE + 4), canvas.fit(count, width - 2, size=SMALL_SIZE), size=SMALL_SIZE, colour=MUTED)
        canvas.line([(x0, top - 2), (x0, top + row * len(order))], INK)
        canvas.line([(x0 + span, top - 2), (x0 + span, top + row * len(order))], GRID)
        positive, negative = parts[action]
        for index, unit in enumerate(order):
            blue = x0 + span * float(positive[unit]) / limit
            red = blue + span * float(negative[unit]) / limit
            _two_tone_bar(canvas, x0, blue, red, centre=top + row * index + row / 2, half=0.34 * row)
    bottom, scale = top + row * len(order) + 4, f"each panel 0 to {format_value(limit)}"
    _line(canvas, bottom, [f"mean |attribution| over {num_states} states; {scale}", scale])
    if note:
        _line(canvas, bottom + LINE, note)
    return Chart(canvas.pixels, tuple(shown))


def earlier_states(history: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """``(global step, state)`` of each run of ``history`` (:func:`run_state` of its verdict and trust status)."""
    return [(int(entry["global_step"]), run_state(entry.get("verdict"), entry.get("trust"))) for entry in history]

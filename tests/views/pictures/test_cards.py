"""The cards: the verdict card, the shares over training, why this action; each sized for TensorBoard's card."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from lightning_ig.views.pictures.cards import (
    LINE,
    STATE_COLOURS,
    _wrapped,
    action_panels,
    contrast_chart,
    earlier_states,
    format_step,
    run_state,
    shares_chart,
    verdict_card,
)
from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, NEGATIVE, POSITIVE, SMALL_SIZE, Canvas, rgb


def _has(pixels: np.ndarray, colour: str) -> bool:
    """Whether some pixel is exactly ``colour`` (the core of a glyph or a bar drawn in it)."""
    return bool(np.all(pixels == rgb(colour), axis=2).any())


def _head(pixels: np.ndarray) -> np.ndarray:
    """The rows above the first bar: the verdict, the trust status, the earlier runs (the bars' red is their sign)."""
    bar = np.all(pixels == rgb(POSITIVE), axis=2) | np.all(pixels == rgb(NEGATIVE), axis=2)
    longest = [max((len(run) for run in "".join("1" if b else " " for b in row).split()), default=0) for row in bar]
    return pixels[: next(y for y, length in enumerate(longest) if length >= 12)]  # a bar, never a glyph


def _card(accuracy=("pass", "worst error 1e-3"), trust=None, earlier=(), positive=None, negative=None):
    positive = np.array([3.0, 1.0, 0.5]) if positive is None else positive
    negative = np.array([1.0, 0.0, 0.5]) if negative is None else negative
    return verdict_card(
        ["bricks", "paddle", "ball"], positive, negative, title=["t"], accuracy=accuracy, trust=trust, earlier=earlier
    )


def test_a_run_state_fails_where_either_the_accuracy_or_the_trust_checks_failed():
    assert run_state("pass", "passed") == "pass"
    assert run_state("fail", "passed") == run_state("pass", "failed") == run_state("non-finite", None) == "fail"
    assert run_state("unchecked", "passed") == run_state("pass", "unresolved") == "unresolved"
    assert run_state(None, "failed") == "unknown"
    history = [{"global_step": 10, "verdict": "pass", "trust": "passed"}, {"global_step": 20, "verdict": "fail"}]
    assert earlier_states(history) == [(10, "pass"), (20, "fail")]


def test_a_failing_run_is_never_drawn_in_the_pass_colour():
    passed = _head(_card().pixels)
    assert _has(passed, STATE_COLOURS["pass"]) and not _has(passed, STATE_COLOURS["fail"])
    failed = _head(_card(accuracy=("fail", "worst error 0.3 > 0.0141")).pixels)
    assert _has(failed, STATE_COLOURS["fail"]) and not _has(failed, STATE_COLOURS["pass"])
    non_finite = _head(_card(accuracy=("non-finite", "NaN/Inf in 1 of 8 states")).pixels)
    assert _has(non_finite, STATE_COLOURS["fail"]) and not _has(non_finite, STATE_COLOURS["pass"])
    distrusted = _head(_card(trust=("failed", "sanity: the copy agrees")).pixels)
    assert _has(distrusted, STATE_COLOURS["fail"])
    unresolved = _head(_card(trust=("unresolved", "sanity: with 4 units")).pixels)
    assert _has(unresolved, STATE_COLOURS["unresolved"]) and not _has(unresolved, STATE_COLOURS["fail"])


def test_earlier_failures_are_counted_on_a_passing_card():
    quiet = _head(_card(earlier=[(10, "pass"), (20, "pass")]).pixels)
    seen = _head(_card(earlier=[(10, "pass"), (20, "fail")]).pixels)
    assert not _has(quiet, STATE_COLOURS["fail"]) and _has(seen, STATE_COLOURS["fail"])


def test_a_unit_whose_cells_cancel_shows_both_signs_in_proportion():
    card = _card(positive=np.array([3.0, 0.0, 0.0]), negative=np.array([1.0, 0.0, 0.0]))
    assert card.labels[0] == "bricks"
    blue = np.all(card.pixels == rgb(POSITIVE), axis=2)
    red = np.all(card.pixels == rgb(NEGATIVE), axis=2)
    rows = np.nonzero(blue.sum(axis=1) > 20)[0]  # the bar's rows, not the legend's swatch
    row = int(rows[0])
    assert red[row].sum() > 0
    assert blue[row].sum() / red[row].sum() == pytest.approx(3.0, rel=0.1)  # 3 raises, 1 lowers
    assert card.pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3)


def test_the_verdict_card_argument_errors():
    with pytest.raises(ValueError, match="got 3 labels, 2 positive and 3 negative parts"):
        _card(positive=np.ones(2))


def test_shares_stack_each_run_to_the_whole_in_the_units_colours():
    colours = ["#e69f00", "#f0f0f0", "#8c8c8c"]
    history = np.array([[1.0, 1.0, 2.0], [2.0, 1.0, 1.0], [3.0, 0.0, 1.0]])
    chart = shares_chart(["paddle", "ball", "brick"], [100, 200, 300], history, title=["t"], colours=colours)
    assert chart.labels == ("paddle", "brick", "ball")  # by the last run's share
    orange = np.all(chart.pixels == rgb(colours[0]), axis=2)
    columns = np.nonzero(orange.any(axis=0))[0]
    plot_columns = columns[columns < CARD_WIDTH - 100]  # the plot, not the swatches of the labels beside it
    first, last = plot_columns.min(), plot_columns.max()
    assert orange[:, last].sum() / orange[:, first].sum() == pytest.approx(0.75 / 0.25, rel=0.05)


def test_the_shares_carry_every_runs_verdict_in_a_strip():
    history = np.ones((4, 2))
    states = ["pass", "fail", "pass", "unresolved"]
    chart = shares_chart(["a", "b"], [1, 2, 3, 4], history, title=["t"], states=states).pixels
    plain = shares_chart(["a", "b"], [1, 2, 3, 4], history, title=["t"]).pixels
    assert _has(chart, STATE_COLOURS["fail"]) and _has(chart, STATE_COLOURS["unresolved"])
    assert not _has(plain, STATE_COLOURS["fail"])
    with pytest.raises(ValueError, match="got 2 run states for 4 runs"):
        shares_chart(["a", "b"], [1, 2, 3, 4], history, title=["t"], states=states[:2])
    # guards against: one pixel column per run sampled, so one failed run of thousands fell between the columns
    for runs in (500, 3_000, 20_000):
        for failed in (1, runs // 3 + 1, runs - 2):
            many = ["pass"] * runs
            many[failed] = "fail"
            chart = shares_chart(["a", "b"], list(range(runs)), np.ones((runs, 2)), title=["t"], states=many).pixels
            assert _has(chart, STATE_COLOURS["fail"]), (runs, failed)


def test_drawing_the_shares_does_not_grow_with_the_runs_beyond_the_columns():
    # guards against: every pixel row compared with every run (height x runs x bands), 0.44 s at 100,000 runs
    runs = 200_000
    history = np.random.default_rng(5).random((runs, 8))
    started = tracemalloc.start() or None
    shares_chart([f"g{i}" for i in range(8)], list(range(runs)), history, title=["t"], states=["pass"] * runs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert started is None and peak < 10 * history.nbytes, peak  # a few copies of the history (42 of them before)


def test_shares_sum_the_small_units_into_other():
    history = np.random.default_rng(4).random((5, 12))
    chart = shares_chart([f"g{i}" for i in range(12)], list(range(5)), history, title=["t"])
    assert len(chart.labels) == 8 and chart.labels[-1] == "other 5"
    with pytest.raises(ValueError, match="got 1 labels"):
        shares_chart(["a"], [1], np.ones((1, 2)), title=["t"])
    with pytest.raises(ValueError, match="at least one run"):
        shares_chart(["a"], [], np.zeros((0, 1)), title=["t"])


def test_steps_are_written_short():
    assert [format_step(s) for s in (250, 3437, 24000, 125000, 2_500_000)] == ["250", "3,437", "24k", "125k", "2.5M"]
    # guards against: "1000k" for 999,500 and "12300M" past a billion (five characters at most)
    assert [format_step(s) for s in (999_499, 999_500, 999_500_000, 12_345_678_901)] == ["999k", "1M", "1G", "12.3G"]


def test_a_long_band_label_goes_on_two_lines_broken_at_a_space_never_cut_mid_word():
    canvas = Canvas(1, 1)
    assert _wrapped(canvas, "4.5% cart position", 127) == ["4.5% cart position"]
    assert _wrapped(canvas, "58% pole angular velocity", 127) == ["58% pole angular", "velocity"]
    share, name = _wrapped(canvas, "58% a-very-long-single-name", 60)
    assert share == "58%" and name.endswith("…")  # the second line is cut where it must be
    assert _wrapped(canvas, "100%-and-a-very-long-name", 60)[0].endswith("…")  # nowhere to break: one cut line
    history = np.array([[1.0, 2.0, 5.0, 12.0], [1.0, 2.5, 5.0, 13.0]])

    def inked_rows(longest: str) -> int:
        labels = ["cart position", "cart velocity", "pole angle", longest]
        chart = shares_chart(labels, [250, 500], history, title=["t"])
        text = np.all(chart.pixels[LINE + 8 :, CARD_WIDTH - 127 :] < 120, axis=2)  # the labels' ink
        return int(text.any(axis=1).sum())

    assert inked_rows("pole angular velocity") >= inked_rows("pole rate") + 8  # a second line of text


def test_contrast_chart_names_both_actions_and_fits_the_card():
    rng = np.random.default_rng(1)
    positive, negative = rng.random(4), rng.random(4)
    labels = ["paddle", "ball", "trail", "brick"]
    chart = contrast_chart(labels, positive, negative, greedy="left", runner_up="right", num_states=20, of_states=64)
    assert chart.pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3)
    other = contrast_chart(labels, positive, negative, greedy="right", runner_up="left", num_states=20, of_states=64)
    assert not np.array_equal(other.pixels[:16], chart.pixels[:16])  # the title says which is which


def test_action_panels_share_one_scale_so_equal_values_are_equal_bars():
    parts = [(np.array([1.0, 0.5]), np.zeros(2)), (np.array([0.5, 0.25]), np.zeros(2))]
    pixels = action_panels(
        ["ball", "paddle"], ["left", "right"], parts, greedy_counts=[1, 1], num_states=2, title=["t"]
    ).pixels
    blue = np.all(pixels == rgb(POSITIVE), axis=2)
    ratios = []
    for row in np.nonzero(blue.any(axis=1))[0]:
        columns = np.nonzero(blue[row])[0]
        runs = np.split(columns, np.nonzero(np.diff(columns) > 1)[0] + 1)
        if len(runs) == 2 and columns.min() > 40:  # a bar row: one bar per panel (the legend's swatch is at the left)
            ratios.append(len(runs[1]) / len(runs[0]))
    assert ratios and np.allclose(ratios, 0.5, atol=0.05)  # half the value, half the bar: one scale for both panels
    assert not np.all(pixels == rgb(NEGATIVE), axis=2)[4 * LINE :].any()  # no negative parts


def test_action_panels_argument_errors_and_many_actions():
    parts = [(np.ones(3), np.ones(3))] * 3
    with pytest.raises(ValueError, match="got 3 parts and 2 counts for 2 actions"):
        action_panels(["a", "b", "c"], ["x", "y"], parts, greedy_counts=[1, 1], num_states=2, title=["t"])
    many = [(np.full(3, float(a + 1)), np.zeros(3)) for a in range(18)]
    chart = action_panels(
        ["a", "b", "c"], [f"a{i}" for i in range(18)], many, greedy_counts=list(range(18)), num_states=9, title=["t"]
    )
    assert chart.pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3)  # the six most often greedy actions, not 18 slivers


def test_band_labels_never_overprint_each_other_nor_leave_the_chart():
    """Eight long names (LunarLander's observations spelled out): two lines each would overflow the chart's height,
    so each gets one line, cut; every label's swatch stays clear of the next and inside the chart (the bottom ones
    used to be drawn over each other)."""
    names = [
        "horizontal coordinate of the lander",
        "vertical coordinate of the lander",
        "horizontal velocity of the lander",
        "vertical velocity of the lander",
        "angle of the lander body",
        "angular velocity of the lander body",
        "left leg touching the ground",
        "right leg touching the ground",
    ]
    colours = ["#e6194b", "#3cb44b", "#ffe119", "#4363d8", "#f58231", "#911eb4", "#46f0f0", "#f032e6"]
    mass = np.array([[40.0, 25.0, 15.0, 9.0, 8.0, 7.0, 1.0, 0.5]] * 2)
    chart = shares_chart(names, [3, 6], mass, title=["t"], colours=colours)
    labels = chart.pixels[:, int(CARD_WIDTH * 0.54) + 3 :]  # right of the bands: the swatches and the names
    centres = []
    for colour in colours[:7]:  # the seven largest get a band and a label each, the eighth is "other 1"
        rows = np.nonzero(np.all(labels == rgb(colour), axis=2).any(axis=1))[0]
        assert rows.size and rows.max() < CARD_HEIGHT - 2 * LINE - 8 + 3, colour  # drawn, inside the chart
        centres.append(rows.mean())
    assert np.diff(sorted(centres)).min() >= LINE - 2  # one line apart at least: no two labels overprint


def test_action_panels_write_every_text_inside_the_card(monkeypatch):
    """Six panels under one-letter unit labels: the bare counts' words, 'greedy in 16:', right of the card's edge
    (the labels' column was as narrow as 'x2', so the words began left of the card and read '16:')."""
    drawn = []
    text = Canvas.text

    def spy(self, xy, words, *, size=12, anchor="la", bold=False, **rest):
        drawn.append((xy[0], words, self.text_width(words, size=size, bold=bold), anchor))
        text(self, xy, words, size=size, anchor=anchor, bold=bold, **rest)

    monkeypatch.setattr(Canvas, "text", spy)
    parts = [(np.array([1.0, 0.5]), np.zeros(2))] * 6
    action_panels(["x0", "x1"], list("abcdef"), parts, greedy_counts=[16, 0, 0, 0, 0, 0], num_states=16, title=["t"])
    assert any(words == "greedy in 16:" for _, words, _, _ in drawn)
    for x, words, width, anchor in drawn:
        start = x - width if anchor[0] == "r" else x - width / 2 if anchor[0] == "m" else x
        assert start >= 0 and start + width <= CARD_WIDTH, words


@pytest.mark.parametrize("actions", [6, 18, 100])
def test_action_panels_name_every_panel_whole(monkeypatch, actions):
    """Six panels of 'action 12' (the default names) each read 'actio…': fewer panels, down to two, keep every
    name whole, the most often greedy first."""
    drawn = []
    text = Canvas.text
    monkeypatch.setattr(
        Canvas, "text", lambda self, xy, words, **rest: drawn.append(words) or text(self, xy, words, **rest)
    )
    names = [f"action {i}" for i in range(actions)]
    parts = [(np.array([1.0, 0.5]), np.zeros(2))] * actions
    counts = [0] * actions
    counts[actions - 1] = 9
    action_panels(["x0", "x1"], names, parts, greedy_counts=counts, num_states=9, title=["t"])
    panels = [words for words in drawn if words.startswith("ac")]
    assert len(panels) >= 4 and set(panels) <= set(names) and names[-1] in panels
    assert f"t: the {len(panels)} of {actions} most often greedy" in drawn  # the title says the card shows some


def test_action_panels_name_atari_actions_whole_and_keep_the_note_in_the_card(monkeypatch):
    """Four panels still cut Atari's names ('DOWNRI…' is DOWNRIGHT or DOWNRIGHTFIRE), and six units pushed the note
    under the panels (what A(s, a) is) below the card's edge."""
    drawn = []
    text = Canvas.text
    monkeypatch.setattr(
        Canvas, "text", lambda self, xy, words, **rest: drawn.append((xy, words)) or text(self, xy, words, **rest)
    )
    atari = ["NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT", "UPFIRE"]
    atari += ["RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE", "UPLEFTFIRE", "DOWNRIGHTFIRE", "DOWNLEFTFIRE"]
    counts = [0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 3, 12]
    parts = [(np.linspace(1.0, 0.5, 6), np.full(6, 0.1))] * len(atari)
    labels = [f"x{i}" for i in range(6)]
    note = ["bars: A(s, a) = Q(s, a) − the mean Q over the actions", "A(s, a) = Q(s, a) − mean Q"]
    action_panels(labels, atari, parts, greedy_counts=counts, num_states=32, title=["t"], note=note)
    words = [said for _, said in drawn]
    panels = [said for said in words if said.isupper()]
    assert len(panels) >= 2 and set(panels) <= set(atari) and "DOWNLEFTFIRE" in panels  # every name whole
    ((y, line),) = [(xy[1], said) for xy, said in drawn if said in note]
    assert y + LINE <= CARD_HEIGHT, line  # the note inside the card


def test_contrast_chart_says_over_how_many_states(monkeypatch):
    """The commonest pair may be a few of the states (an 18-action agent's): the card says how many. The title that
    said it fit only the shortest names and counts ('Why right rather than left (12 of 64 states)' read 'Why right')."""
    drawn = []
    text = Canvas.text
    monkeypatch.setattr(
        Canvas, "text", lambda self, xy, words, **rest: drawn.append(words) or text(self, xy, words, **rest)
    )
    contrast_chart(
        ["x0", "x1"], np.array([1.0, 0.5]), np.zeros(2), greedy="right", runner_up="left", num_states=12, of_states=64
    )
    assert "Why right rather than left" in drawn
    assert any("12 of 64 states" in words for words in drawn)


def test_a_long_trust_line_gets_its_own_line_and_the_fullest_card_still_holds_its_legend(monkeypatch):
    """The checks a run passed were cut at the status words ('accuracy, faithfulnes…'), the unresolved ones last."""
    drawn: list[tuple[tuple[float, float], str]] = []
    original = Canvas.text

    def recording(self, xy, text, **kwargs):
        drawn.append((xy, text))
        return original(self, xy, text, **kwargs)

    monkeypatch.setattr(Canvas, "text", recording)
    why = "accuracy; sanity, faithfulness, stability unresolved"  # the longest a passed status reads
    units = [f"unit {i}" for i in range(7)]  # the most rows: five bars and the line for the rest
    verdict_card(
        units,
        np.arange(1.0, 8.0),
        np.zeros(7),
        title=["t"],
        accuracy=("pass", "estimated attribution error 4.07e-03 ≤ 0.0141"),
        trust=("passed", why),
        earlier=[(10, "fail")],
    )
    assert why in [text for _, text in drawn]  # whole
    legend = max(y for (_, y), _ in drawn)
    assert legend + SMALL_SIZE / 2 + 2 <= CARD_HEIGHT  # its glyphs inside the card

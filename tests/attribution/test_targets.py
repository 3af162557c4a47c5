"""The one Target (parsed once, bound to a model, asked by every consumer), and target="contrast" (the greedy output
minus the runner-up's, both chosen at the state and held along the path) and target="each", with the error figures,
on every path the engine has: eager autograd, finite differences, n_steps="auto", and a captured graph's replay
(emulated on the CPU, tests/support/graphs.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, integrated_gradients
from lightning_ig.attribution.targets import Target, action_labels, target_forward
from tests.support.graphs import EmulatedCapture
from tests.support.models import DuelingMLP
from tests.support.tolerance import assert_close_scaled

F64 = torch.float64


def _model(seed: int = 50, actions: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return DuelingMLP(5, actions).double().eval()


def _states(seed: int = 51, count: int = 6) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(count, 5, dtype=F64)


def _pairs(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Each state's greedy action and runner-up at the state itself: the two largest outputs, in order."""
    with torch.no_grad():
        return model(x).topk(2, dim=1).indices  # (B, 2)


def _contrast_by_hand(model: torch.nn.Module, x: torch.Tensor, **options: object) -> torch.Tensor:
    """IG of Q[greedy] - Q[runner-up] with the pairs fixed, state by state through a plain scalar target."""
    pairs = _pairs(model, x)
    rows = []
    for state, (greedy, runner_up) in enumerate(pairs.tolist()):
        forward = lambda z, g=greedy, r=runner_up: model(z)[:, g] - model(z)[:, r]  # noqa: E731
        rows.append(integrated_gradients(forward, x[state : state + 1], **options).attributions[0])
    return torch.stack(rows)


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
def test_contrast_is_the_greedy_minus_the_runner_up_held_fixed_along_the_path(gradient: str) -> None:
    model, x = _model(), _states()
    result = integrated_gradients(model, x, target="contrast", n_steps=16, gradient=gradient)
    pairs = _pairs(model, x)
    assert result.target == "contrast" and torch.equal(result.target_actions, pairs)
    assert result.attributions.shape == x.shape
    expected = _contrast_by_hand(model, x, n_steps=16, gradient=gradient)
    ulps = 64 if gradient == "autograd" else 2**20  # central differences: O(eps^(2/3)) of the values
    assert_close_scaled(result.attributions, expected, ulps=ulps, dtype=F64, scale=float(expected.abs().max()))
    with torch.no_grad():
        outputs = model(x)
    states = torch.arange(len(x))
    gap = outputs[states, pairs[:, 0]] - outputs[states, pairs[:, 1]]
    assert bool((gap >= 0).all())  # the greedy output is the larger at x
    assert_close_scaled(result.f_input, gap, ulps=8, dtype=F64, scale=float(gap.abs().max()))
    # the figures are there, one per state, and judge the contrast's own path
    assert result.attribution_error.shape == result.mass_relative_error.shape == result.near_baseline.shape == (6,)
    assert torch.isfinite(result.attribution_error).all() and torch.isfinite(result.mass_relative_error).all()


def test_contrast_under_auto_keeps_the_pairs_it_chose_at_the_first_level() -> None:
    model, x = _model(seed=52), _states(seed=53)
    result = integrated_gradients(model, x, target="contrast", n_steps="auto", completeness_tol=1e-3)
    assert torch.equal(result.target_actions, _pairs(model, x))
    for state, n in enumerate(result.n_steps_per_state.tolist()):
        fixed = _contrast_by_hand(model, x[state : state + 1], n_steps=n, method="riemann_middle")
        assert_close_scaled(result.attributions[state], fixed[0], ulps=64, dtype=F64, scale=float(fixed.abs().max()))


def test_contrast_replayed_from_a_graph_chooses_the_pairs_of_the_new_states() -> None:
    capture = EmulatedCapture()
    model = _model(seed=54)
    engine = IntegratedGradients(model, graph_capture=capture, target="contrast", n_steps=12)
    first, second = _states(seed=55), _states(seed=56)
    engine.attribute(first)
    assert engine.last_mode == "capture"
    replayed = engine.attribute(second)
    assert engine.last_mode == "graph" and capture.graphs[0].replays >= 2
    eager = integrated_gradients(model, second, target="contrast", n_steps=12)
    assert torch.equal(replayed.target_actions, _pairs(model, second))
    assert not torch.equal(_pairs(model, first), _pairs(model, second))  # the replay chose anew, not the capture's
    torch.testing.assert_close(replayed.attributions, eager.attributions, rtol=0, atol=0)
    for name in ("attribution_error", "mass_relative_error", "near_baseline"):
        torch.testing.assert_close(getattr(replayed, name), getattr(eager, name), rtol=0, atol=0)


def test_a_target_callable_of_the_wrong_shape_says_what_it_got_and_what_its_rows_are() -> None:
    net = DuelingMLP(4, 2)
    with pytest.raises(ValueError, match=r"output \(\d+, 2\) to one value per row.*points on the states' paths.*got"):
        integrated_gradients(net, torch.randn(3, 4), target=lambda q: q)  # (N, 2): both columns


def test_a_forward_returning_a_dict_is_told_to_pick_one_of_its_keys() -> None:
    # guards against: the advice for a dict output was model(x)[0], a KeyError
    with pytest.raises(TypeError, match=r"got dict; pick one, e.g. forward=lambda x: model\(x\)\['q'\]"):
        integrated_gradients(lambda z: {"q": z, "v": z.sum(1)}, torch.randn(2, 3), target=0)
    with pytest.raises(TypeError, match=r"got tuple; pick one, e.g. forward=lambda x: model\(x\)\[0\]"):
        integrated_gradients(lambda z: (z, z.sum(1)), torch.randn(2, 3), target=0)


def test_contrast_needs_two_outputs() -> None:
    with pytest.raises(ValueError, match="target='contrast' needs a forward returning"):
        integrated_gradients(lambda z: z.sum(1, keepdim=True), _states(), target="contrast", n_steps=4)


@pytest.mark.parametrize("capture", [False, True])
def test_each_has_the_figures_per_output_and_state(capture: bool) -> None:
    model, x = _model(seed=57, actions=3), _states(seed=58, count=5)
    if capture:
        engine = IntegratedGradients(model, graph_capture=EmulatedCapture(), target="each", n_steps=10)
        engine.attribute(x)
        result = engine.attribute(x)
        assert engine.last_mode == "graph"
    else:
        result = integrated_gradients(model, x, target="each", n_steps=10)
    assert result.attributions.shape == (3, 5, 5)
    for name in ("attribution_error", "mass_relative_error", "near_baseline"):
        assert getattr(result, name).shape == (3, 5), name
    for action in range(3):
        single = integrated_gradients(model, x, target=action, n_steps=10)
        assert_close_scaled(result.attribution_error[action], single.attribution_error, ulps=64, dtype=F64)
        assert_close_scaled(result.mass_relative_error[action], single.mass_relative_error, ulps=64, dtype=F64)
    worst = result.attribution_error[~result.near_baseline].max()
    assert result.worst_attribution_error == float(worst)


def test_a_numpy_integer_target_is_an_action_index_as_an_int_is() -> None:
    import numpy as np

    model, states = _model(), _states()
    for target in (np.int64(1), np.int32(1), np.uint8(1)):
        result = integrated_gradients(model, states, target=target, n_steps=8)
        assert result.target == "action:1"
        assert torch.equal(result.attributions, integrated_gradients(model, states, target=1, n_steps=8).attributions)


def _double(outputs: torch.Tensor) -> torch.Tensor:
    return 2 * outputs[:, 0]


# given, label, as a user spells it, every_output, contrasts, by_state, about_actions, checks_deletion, words, unit
PARSED = [
    (None, "output", "output", False, False, False, False, True, "the output", "model output"),
    ("mean", "mean", "mean", False, False, False, False, True, "V(s)", "mean output = V(s)"),
    (2, "action:2", 2, False, False, False, True, True, "Q(s, 2)", "Q(s, 2)"),
    ("action:2", "action:2", 2, False, False, False, True, True, "Q(s, 2)", "Q(s, 2)"),
    (torch.tensor(3), "action:3", 3, False, False, False, True, True, "Q(s, 3)", "Q(s, 3)"),
    ("each", "each", "each", True, False, False, True, True, "Q(s, a)", "Q(s, a) of every action"),
    (
        "contrast",
        "contrast",
        "contrast",
        False,
        True,
        True,
        True,
        False,
        "Q(greedy) − Q(runner-up)",
        "Q(greedy) - Q(runner-up)",
    ),
    (torch.tensor([0, 1]), "per_row", "per_row", False, False, True, False, False, "the output", "model output"),
    (_double, "callable:_double", "_double", False, False, False, False, True, "_double", "_double"),
]


@pytest.mark.parametrize(
    ("given", "label", "spelt", "each", "contrast", "by_state", "actions", "deletion", "words", "unit"), PARSED
)
def test_a_target_is_parsed_once_and_says_what_each_consumer_asks(
    given, label, spelt, each, contrast, by_state, actions, deletion, words, unit
) -> None:
    target = Target.parse(given)
    assert Target.parse(target) is target  # a Target passes through
    assert (target.label, target.as_given, target.every_output, target.contrasts) == (label, spelt, each, contrast)
    assert (target.by_state, target.about_actions, target.checks_deletion) == (by_state, actions, deletion)
    assert (target.words, target.unit, target.rows_per_state, target.chooses_pairs) == (words, unit, 1, contrast)


@pytest.mark.parametrize(
    ("given", "error", "words"),
    [
        ("median", ValueError, "target must be None, 'mean', 'each', 'contrast'"),
        ("action:x", ValueError, "got 'action:x'"),
        (-1, ValueError, "non-negative action index, got -1"),
        (True, TypeError, "not a bool"),
        (torch.tensor([0.5]), TypeError, "integer action indices"),
        (2.5, TypeError, r"got float \(2.5\)"),  # the value too, not only its type
        # "action:N" as documented, N in digits 0-9: int() read Arabic digits as an index, "²" with its own words
        ("action:\u0663", ValueError, r"'action:N' \(N in digits 0-9\).*got 'action:\u0663'"),
        ("action:\u00b2", ValueError, "got 'action:\u00b2'"),
        ("action:" + "9" * 5000, ValueError, "^target must be"),  # not Python's "Exceeds the limit (4300 digits)"
        (torch.tensor([0, 1], device="meta"), ValueError, "target is on the meta device"),
        (torch.tensor([0, 1]).to_sparse(), ValueError, "target is a torch.sparse_coo tensor"),
    ],
)
def test_a_bad_target_is_refused_where_it_comes_in(given, error, words) -> None:
    with pytest.raises(error, match=words):
        Target.parse(given)


def test_a_forward_that_loses_its_rows_is_not_told_to_take_target_none() -> None:
    """A forward that returns (A,) whatever the batch (it indexes the batch away) was told "a forward with one output
    per row takes target=None": it returns no value per row, and target=None would fail too."""
    model = _model()
    with pytest.raises(ValueError, match=r"with target=1 forward must return \(N, A\)") as caught:
        integrated_gradients(lambda s: model(s)[0], _states(), target=1, n_steps=4)
    assert "target=None" not in str(caught.value)


def test_bound_to_a_model_a_target_gets_its_actions_labels_and_rows_per_state() -> None:
    each = Target.parse("each").bind((7, 3))
    assert each.actions == ("action 0", "action 1", "action 2") and each.rows_per_state == 3
    assert Target.parse("contrast").bind((7, 2), ["left", "right"]).actions == ("left", "right")
    assert Target.parse(1).bind((7, 2), ["left", "right"]).words == "Q(s, right)"  # names only where given
    assert Target.parse(1).bind((7, 2), ["left", "right"]).unit == "Q(s, right)"  # the text's units as its header
    assert Target.parse(1).bind((7, 2)).unit == "Q(s, 1)"
    assert Target.parse(1).bind((7, 2)).actions is None
    for one_value in ("mean", 0):  # a model with one value per state: that value is attributed
        assert Target.parse(one_value).bind((7,)).kind == "output"
    with pytest.raises(ValueError, match="target='each' needs at least two outputs per state"):
        Target.parse("each").bind((7,))
    with pytest.raises(ValueError, match="--target contrast needs at least two outputs"):
        Target.parse("contrast").bind((7, 1), spelt="--target contrast")
    with pytest.raises(ValueError, match=r"target=2 is out of range: the model returns 2 outputs per state"):
        Target.parse(2).bind((7, 2))
    # the command line's words throughout, and one output per state said as one, not as a shape (the probe's (1,))
    for given, words in (("each", "model returns 1: use --target mean or"), (3, "per state; pass --target mean or 0")):
        with pytest.raises(ValueError, match=words) as raised:
            Target.parse(given).bind((1,), spelt=f"--target {given}")
        assert "target='mean'" not in str(raised.value) and "shape" not in str(raised.value)
    with pytest.raises(ValueError, match="action_names has 3 names but the model returns 2 actions"):
        Target.parse("each").bind((7, 2), ["a", "b", "c"])


def test_one_value_per_state_as_a_column_is_that_value_in_its_words() -> None:
    # guards against: a regression model's (N, 1) output bound as "mean" (words V(s), units "mean output = V(s)")
    # where its (N,) twin, and diag on the same model, said "the output"
    for one_value in ("mean", 0):
        bound = Target.parse(one_value).bind((7, 1))
        assert (bound.kind, bound.label, bound.words, bound.unit) == ("output", "output", "the output", "model output")
    with pytest.raises(
        ValueError, match=r"target=1 is out of range: .* returns 1 output per state; pass target='mean'"
    ):
        Target.parse(1).bind((7, 1))


def test_a_lambda_forward_is_said_as_the_output_not_as_its_name() -> None:
    # guards against: the verdict card titled "IG at step 150: <lambda>" and "What <lambda> relies on" for
    # forward=lambda m, x: m(x)[1], a way to attribute a value head
    def value_of_state(x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1)

    anonymous = Target.of_forward(lambda x: x.sum(-1))
    assert anonymous.label.endswith("<lambda>") and (anonymous.words, anonymous.unit) == ("the output", "model output")
    # a name the user gave is kept, without where it was defined: the card said "What test_a_lambda_forward_is_said_as_
    # the_output_not_as_its_name.<locals>.value_of_state relies on" for a function defined in a function (a main())
    assert (Target.of_forward(value_of_state).words, Target.of_forward(value_of_state).unit) == ("value_of_state",) * 2
    assert Target.of_forward(value_of_state).as_given.endswith("<locals>.value_of_state")  # its state key as before


def test_per_state_indices_are_checked_against_the_batch_and_moved() -> None:
    target = Target.parse(torch.tensor([0, 2, 1], dtype=torch.int32)).on(3, torch.device("cpu"))
    assert target.rows.dtype == torch.int64 and target.rows_max == 2
    with pytest.raises(ValueError, match=r"shape \(B,\) = \(4,\)"):
        Target.parse(torch.tensor([0, 2, 1])).on(4, torch.device("cpu"))
    with pytest.raises(ValueError, match="indices must be >= 0, got -1"):
        Target.parse(torch.tensor([0, -1])).on(2, torch.device("cpu"))
    assert target.subset(torch.tensor([2])).rows.tolist() == [1]


def test_action_labels_are_the_names_given_or_numbered() -> None:
    assert action_labels(None, 3) == ["action 0", "action 1", "action 2"]
    assert action_labels(("a", "b"), 2) == ["a", "b"]
    with pytest.raises(ValueError, match="action_names has 2 names but the model returns 3 actions"):
        action_labels(["a", "b"], 3)


def test_target_forward_gives_one_value_per_row_and_refuses_what_needs_the_engine() -> None:
    model, x = _model(), _states()
    with torch.no_grad():
        outputs = model(x)
        assert torch.equal(target_forward(model, "mean")(x), outputs.mean(1))
        assert torch.equal(target_forward(model, 2)(x), outputs[:, 2])
    for given, named in (("each", "'each'"), ("contrast", "'contrast'"), (torch.tensor([0, 1]), "a tensor")):
        with pytest.raises(ValueError, match=f"target_forward cannot express target={named};"):
            target_forward(model, given)


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
def test_contrast_leaves_the_states_of_a_forward_that_changes_its_input(gradient: str) -> None:
    """target="contrast" chooses the pairs with a forward of its own on the states: a forward that changes its input
    in place gets a copy, and the caller's states are as they were after the call, whether it ran (finite
    differences) or raised (autograd refuses the in-place change of a path point); the choice used to be given the
    caller's tensor itself."""
    model, x = _model(), _states()
    kept = x.clone()

    def doubling(z: torch.Tensor) -> torch.Tensor:
        z.mul_(2)
        return model(z)

    with contextlib.suppress(RuntimeError):
        integrated_gradients(doubling, x, target="contrast", n_steps=8, gradient=gradient)
    assert torch.equal(x, kept)


def test_a_target_callable_returning_integers_is_told_to_return_a_value_not_an_index() -> None:
    """A target callable returning integer values (an action's index, not its value) is refused with a TypeError that
    says what to return instead."""
    with pytest.raises(TypeError, match=r"got dtype torch.int64: return a value .*not an index \(q.argmax"):
        integrated_gradients(_model(), _states(), target=lambda q: q.argmax(1), n_steps=4)


def test_mean_of_a_forward_with_one_value_per_state_is_that_value() -> None:
    """A forward returning ``(N,)`` under ``target="mean"`` is attributed as with ``target=None``, as the callback reads
    it (the engine used to refuse it)."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(5, 4)
    one = integrated_gradients(lambda s: net(s).squeeze(1), x, target="mean", n_steps=16)
    bare = integrated_gradients(lambda s: net(s).squeeze(1), x, target=None, n_steps=16)
    assert torch.equal(one.attributions, bare.attributions) and torch.equal(one.f_input, bare.f_input)
    for given, told in ((0, "target=0 forward"), (torch.zeros(5, dtype=torch.long), "target=a tensor forward")):
        with pytest.raises(ValueError, match=f"{told} must return \\(N, A\\) .*takes target=None"):  # as written
            integrated_gradients(lambda s: net(s).squeeze(1), x, target=given, n_steps=16)
